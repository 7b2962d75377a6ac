// Usage: tokens trained, sampled and served by the organization, by kind and base model,
// over an optional time window (`/v1/usage?since=&until=`).

import { get } from "./api.js";
import { barList } from "./charts.js";
import { fill, h, heading, number, section, table } from "./dom.js";
import { showError } from "./ui.js";

export function usageTotals(lines) {
  const totals = {};
  for (const line of lines) totals[line.kind] = (totals[line.kind] ?? 0) + line.tokens;
  return totals;
}

function isoOrNull(value) {
  return value ? new Date(value).toISOString() : null;
}

function report(usage) {
  const totals = usageTotals(usage.data);
  return [
    section(
      "Tokens by kind",
      barList(
        ["trained", "sampled", "served"].map((kind) => ({ label: kind, value: totals[kind] ?? 0 })),
        (value) => `${number(value)} tokens`,
      ),
    ),
    section(
      "By kind and base model",
      table(
        "Tokens by kind and base model",
        [
          ["Kind", (line) => line.kind],
          ["Base model", (line) => line.base_model],
          ["Tokens", (line) => number(line.tokens), "num"],
          ["Records", (line) => number(line.records), "num"],
        ],
        usage.data,
        { empty: "No usage recorded in this window." },
      ),
    ),
  ];
}

export async function render() {
  const results = h("div", { id: "usage-report" }, report(await get("/v1/usage")));
  const since = h("input", { id: "usage-since", name: "since", type: "datetime-local" });
  const until = h("input", { id: "usage-until", name: "until", type: "datetime-local" });
  const form = h(
    "form",
    { class: "inline-form", "aria-label": "Time window" },
    h("label", { for: "usage-since" }, "Since"),
    since,
    h("label", { for: "usage-until" }, "Until"),
    until,
    h("button", { type: "submit" }, "Show"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const usage = await get("/v1/usage", { since: isoOrNull(since.value), until: isoOrNull(until.value) });
      fill(results, report(usage));
    } catch (error) {
      showError(error);
    }
  });
  return [...heading("Usage", "Tokens trained, sampled and served by your organization."), form, results];
}
