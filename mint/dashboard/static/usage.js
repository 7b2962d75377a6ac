// Usage: tokens trained, sampled and served by the organization, by kind and base model, with
// what they cost, over an optional time window (`/v1/usage?since=&until=`); and the
// organization's spend limits with this month's spend (`/v1/organization/spend_limits`).

import { get } from "./api.js";
import { barList } from "./charts.js";
import { facts, fill, h, heading, money, number, section, table, when } from "./dom.js";
import { showError } from "./ui.js";

export function usageTotals(lines) {
  const totals = {};
  for (const line of lines) totals[line.kind] = (totals[line.kind] ?? 0) + line.tokens;
  return totals;
}

// Full-parameter training is billed by device time: its `tokens` are seconds.
function quantity(line) {
  return line.kind === "device_seconds" ? `${number(line.tokens)} s` : `${number(line.tokens)} tokens`;
}

function isoOrNull(value) {
  return value ? new Date(value).toISOString() : null;
}

function report(usage) {
  const totals = usageTotals(usage.data);
  return [
    section("Cost", h("p", { id: "usage-total" }, `${money(usage.total_cost_usd)} in this window`)),
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
        "Usage by kind and base model",
        [
          ["Kind", (line) => line.kind],
          ["Base model", (line) => line.base_model],
          ["Amount", (line) => quantity(line), "num"],
          ["Records", (line) => number(line.records), "num"],
          ["Cost", (line) => money(line.cost_usd), "num"],
        ],
        usage.data,
        { empty: "No usage recorded in this window." },
      ),
    ),
  ];
}

function limit(value) {
  return value === null || value === undefined ? "none" : money(value);
}

function spendLimits(limits) {
  return section(
    "Spend limits",
    facts([
      ["Spent this month", h("span", { id: "spent-this-month" }, money(limits.spent_this_month_usd))],
      ["Monthly limit", limit(limits.month_usd)],
      ["Per-job limit", limit(limits.job_usd)],
      ["Month started", when(limits.month_started_at)],
    ]),
    h("p", { class: "muted" }, "Admins set them with PATCH /v1/organization/spend_limits."),
  );
}

export async function render() {
  const [usage, limits] = await Promise.all([get("/v1/usage"), get("/v1/organization/spend_limits")]);
  const results = h("div", { id: "usage-report" }, report(usage));
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
  return [
    ...heading("Usage", "Tokens trained, sampled and served by your organization, and what they cost."),
    spendLimits(limits),
    form,
    results,
  ];
}
