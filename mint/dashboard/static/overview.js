// The overview: how many of each resource the organization has, the newest jobs and eval
// runs, and the tokens used by kind.

import { get } from "./api.js";
import { h, heading, link, number, percent, section, status, table, when } from "./dom.js";
import { usageTotals } from "./usage.js";

const COUNTED = [
  ["Benchmarks", "/v1/benchmarks", "#/benchmarks"],
  ["Eval runs", "/v1/evals", "#/evals"],
  ["Fine-tuning jobs", "/v1/fine_tuning/jobs", "#/jobs"],
  ["Adapters", "/v1/adapters", "#/adapters"],
  ["Deployments", "/v1/deployments", "#/deployments"],
];
const RECENT = 5;
const MAX_COUNTED = 100;

export async function render() {
  const [pages, usage] = await Promise.all([
    Promise.all(COUNTED.map(([, path]) => get(path, { limit: MAX_COUNTED }))),
    get("/v1/usage"),
  ]);
  const counts = h(
    "ul",
    { class: "cards", "aria-label": "Resource counts" },
    COUNTED.map(([label, , href], index) => {
      const page = pages[index];
      const count = page.has_more ? `${MAX_COUNTED}+` : String(page.data.length);
      return h(
        "li",
        { class: "card" },
        h(
          "a",
          { href },
          h("span", { class: "count", dataset: { count } }, count),
          h("span", { class: "card-label" }, label),
        ),
      );
    }),
  );
  const [, evalPage, jobPage] = pages;
  const totals = usageTotals(usage.data);
  return [
    ...heading("Overview", "Benchmarks, evals, training and deployments of your organization at a glance."),
    counts,
    section(
      "Recent jobs",
      table(
        "The newest fine-tuning jobs",
        [
          ["Job", (job) => link(`#/jobs/${job.id}`, job.id)],
          ["Status", (job) => status(job.status)],
          ["Base", (job) => job.model],
          ["Method", (job) => job.method?.type ?? "supervised"],
          ["Steps", (job) => `${job.completed_steps}/${job.total_steps}`, "num"],
          ["Model", (job) => job.fine_tuned_model ?? "—"],
          ["Created", (job) => when(job.created_at)],
        ],
        jobPage.data.slice(0, RECENT),
        { empty: "No fine-tuning jobs yet." },
      ),
    ),
    section(
      "Recent eval runs",
      table(
        "The newest eval runs",
        [
          ["Run", (run) => link(`#/evals/${run.id}`, run.id)],
          ["Status", (run) => status(run.status)],
          ["Model", (run) => run.model],
          ["Benchmark", (run) => link(`#/benchmarks/${run.benchmark_id}`, `v${run.version}`)],
          ["Accuracy", (run) => percent(run.metrics.accuracy), "num"],
          ["Created", (run) => when(run.created_at)],
        ],
        evalPage.data.slice(0, RECENT),
        { empty: "No eval runs yet." },
      ),
    ),
    section(
      "Usage",
      h(
        "ul",
        { class: "cards", "aria-label": "Tokens by kind" },
        ["trained", "sampled", "served"].map((kind) =>
          h(
            "li",
            { class: "card" },
            h(
              "a",
              { href: "#/usage" },
              h("span", { class: "count" }, number(totals[kind] ?? 0)),
              h("span", { class: "card-label" }, `tokens ${kind}`),
            ),
          ),
        ),
      ),
    ),
  ];
}
