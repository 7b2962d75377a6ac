// Auto mode: the list of auto runs, and a run's page with where it is (phase, cost so far, best
// so far), its trials (each an ordinary job and a dev eval run, linked), the held-out result
// once it is done, and every decision with its reason. While the run is active the page asks
// for it again every few seconds and redraws.

import { all, get, post } from "./api.js";
import { code, facts, fill, h, heading, link, money, number, percent, section, signedPoints, status, table, when } from "./dom.js";
import { apiForm, baseNames, field, formPanel, input, numberOf, select, textOf } from "./forms.js";
import { showError } from "./ui.js";

const ACTIVE = new Set(["queued", "running"]);
const POLL_MS = 2000;

function target(request) {
  const goal = request.target ?? {};
  if (goal.pass_rate !== null && goal.pass_rate !== undefined) return `held-out pass rate ≥ ${percent(goal.pass_rate, 0)}`;
  return `${signedPoints(goal.delta_over_production)} over ${goal.deployment}`;
}

function budget(request) {
  const parts = [];
  if (request.budget?.usd) parts.push(money(request.budget.usd));
  if (request.budget?.seconds) parts.push(`${number(request.budget.seconds)} s`);
  return parts.join(" and ") || "—";
}

function bestModel(run) {
  return run.best ? code(run.best.model) : "—";
}

const METHODS = [
  ["sft", "SFT"],
  ["dpo", "DPO"],
  ["rl", "RL"],
];

function autoForm(bases, benchmarks) {
  if (!benchmarks.length)
    return h(
      "p",
      { class: "empty", id: "auto-form-empty" },
      "An auto run trains towards a pass rate on a benchmark: ",
      link("#/benchmarks", "create a benchmark"),
      " first.",
    );
  const model = select("auto-model", bases);
  const benchmark = select(
    "auto-benchmark",
    benchmarks.map((item) => [item.id, item.name]),
  );
  const passRate = input("auto-pass-rate", { type: "number", min: 0, max: 100, step: "any", value: "80" });
  const usd = input("auto-budget-usd", { type: "number", min: 0, step: "any", value: "5" });
  const budgetSeconds = input("auto-budget-seconds", { type: "number", min: 1, step: 1, inputmode: "numeric" });
  const methods = METHODS.map(([value, label]) => [
    h("input", { type: "checkbox", id: `auto-method-${value}`, name: "auto-methods", value, checked: true }),
    h("label", { for: `auto-method-${value}` }, label),
  ]);
  const maxTrials = input("auto-max-trials", { type: "number", min: 1, step: 1, inputmode: "numeric", placeholder: "6" });
  const maxSteps = input("auto-max-steps", { type: "number", min: 1, step: 1, inputmode: "numeric", placeholder: "32" });
  const suffix = input("auto-suffix", { maxlength: 64 });
  const evalTokens = input("auto-eval-max-tokens", { type: "number", min: 1, step: 1, inputmode: "numeric", placeholder: "64" });
  return apiForm({
    id: "start-auto",
    title: "Start an auto run",
    description:
      "A goal and a budget: Mint evaluates the base, runs trials (ordinary jobs) chosen on the dev split, and compares the best on held-out tasks.",
    fields: [
      field("Base model", model),
      field("Benchmark", benchmark, "Its train split gives the data, dev picks trials, heldout judges the result."),
      field("Target held-out pass rate (%)", passRate),
      field("Budget (USD)", usd, "Blank: a time budget only."),
      field("Time budget (seconds)", budgetSeconds, "Blank: a money budget only."),
      h("fieldset", {}, h("legend", {}, "Methods allowed"), h("div", { class: "checks" }, methods)),
      field("Most trials", maxTrials, "Blank: 6."),
      field("Most steps per trial", maxSteps, "Blank: 32."),
      field("Adapter name (suffix)", suffix),
      field("Max tokens in its evals", evalTokens, "Blank: 64."),
    ],
    actions: h("button", { type: "submit" }, "Start the auto run"),
    action: async () => {
      const rate = numberOf(passRate);
      const run = await post("/v1/autotune", {
        model: model.value,
        benchmark_id: benchmark.value,
        target: { pass_rate: rate === undefined ? undefined : rate / 100 },
        budget: { usd: numberOf(usd), seconds: numberOf(budgetSeconds) },
        constraints: {
          methods: methods.map(([box]) => box).filter((box) => box.checked).map((box) => box.value),
          max_trials: numberOf(maxTrials),
          max_steps: numberOf(maxSteps),
        },
        suffix: textOf(suffix),
        eval_max_tokens: numberOf(evalTokens),
      });
      location.hash = `#/autotune/${encodeURIComponent(run.id)}`;
    },
  });
}

export async function renderRuns() {
  const [runs, bases, benchmarks] = await Promise.all([all("/v1/autotune", {}, 500), baseNames(), all("/v1/benchmarks")]);
  return [
    ...heading("Auto runs", "A goal and a budget in, the best version out; newest first."),
    formPanel(autoForm(bases, benchmarks), !runs.length),
    table(
      "Auto runs, newest first",
      [
        ["Run", (run) => link(`#/autotune/${run.id}`, run.id)],
        ["Status", (run) => status(run.status)],
        ["Phase", (run) => run.phase],
        ["Base", (run) => run.model],
        ["Target", (run) => target(run.request)],
        ["Cost so far", (run) => money(run.cost_usd), "num"],
        ["Trials", (run) => number(run.trials.length), "num"],
        ["Best so far", bestModel],
        ["Created", (run) => when(run.created_at)],
      ],
      runs,
      { empty: "No auto runs yet: start one with the form above." },
    ),
  ];
}

function runFacts(run) {
  return facts([
    ["Status", h("span", { id: "auto-status" }, status(run.status))],
    ["Phase", h("span", { id: "auto-phase" }, run.phase)],
    ["Base model", run.model],
    ["Benchmark", link(`#/benchmarks/${run.benchmark_id}`, run.benchmark_id)],
    ["Target", target(run.request)],
    ["Budget", budget(run.request)],
    ["Cost so far", h("span", { id: "auto-cost" }, money(run.cost_usd))],
    ["Time so far", `${number(run.elapsed_s)} s`],
    [
      "Best so far",
      run.best
        ? h("span", { id: "auto-best" }, code(run.best.model), ` (trial ${run.best.trial}, dev ${percent(run.best.dev_pass_rate)})`)
        : "—",
    ],
    ["Created", when(run.created_at)],
    ["Finished", when(run.finished_at)],
  ]);
}

function resultFacts(result) {
  if (!result) return h("p", { class: "poll-note" }, "The held-out comparison appears when the run is done.");
  const base = result.against_base;
  if (!base) {
    // Stopped without a held-out comparison: no trial produced a version, or the budget could not pay for it.
    const pairs = result.model ? [["Best version", code(result.model)]] : [];
    pairs.push(["Why it stopped", result.stop_reason]);
    return h("div", { id: "auto-result" }, facts(pairs));
  }
  const pairs = [
    ["Best version", code(result.model)],
    ["Held-out pass rate", h("span", { id: "auto-heldout" }, percent(result.heldout_pass_rate))],
    ["The base on held-out", percent(result.base_heldout_pass_rate)],
    [
      "Against the base",
      `${signedPoints(base.accuracy_delta)} [${signedPoints(base.interval[0])}, ${signedPoints(base.interval[1])}], ` +
        `${base.fixed} fixed, ${base.broken} broken of ${base.tasks} tasks`,
    ],
  ];
  if (result.against_production) {
    const production = result.against_production;
    pairs.push([
      "Against production",
      `${signedPoints(production.accuracy_delta)} [${signedPoints(production.interval[0])}, ` +
        `${signedPoints(production.interval[1])}]`,
    ]);
  }
  pairs.push(["Why it stopped", result.stop_reason]);
  return h("div", { id: "auto-result" }, facts(pairs));
}

function trialsTable(run) {
  return table(
    "Trials, in order",
    [
      ["#", (trial) => number(trial.number), "num"],
      ["Method", (trial) => trial.method],
      [
        "Parameters",
        (trial) =>
          Object.entries(trial.params)
            .filter(([name]) => name !== "method")
            .map(([name, value]) => `${name} ${value}`)
            .join(", "),
      ],
      ["Status", (trial) => status(trial.status)],
      ["Job", (trial) => (trial.job_id ? link(`#/jobs/${trial.job_id}`, trial.job_id) : "—")],
      ["Dev eval", (trial) => (trial.eval_id ? link(`#/evals/${trial.eval_id}`, trial.eval_id) : "—")],
      ["Dev pass rate", (trial) => percent(trial.dev_pass_rate), "num"],
      ["Estimated", (trial) => money(trial.estimated_usd), "num"],
      ["Cost", (trial) => money(trial.cost_usd), "num"],
      ["Version", (trial) => (trial.model ? code(trial.model) : "—")],
    ],
    run.trials,
    { empty: "No trial yet: the base is evaluated first." },
  );
}

function decisionsList(run) {
  return h(
    "ol",
    { id: "auto-decisions", class: "decisions" },
    run.decisions.map((entry) =>
      h("li", {}, h("strong", {}, entry.decision), ": ", entry.reason, " ", h("small", {}, when(entry.at))),
    ),
  );
}

export async function renderRun(runId, { signal }) {
  const path = `/v1/autotune/${encodeURIComponent(runId)}`;
  let run = await get(path);
  const note = h("p", { class: "poll-note", id: "poll-note" });
  const errorLine = h("div", {});
  const details = h("div", {});
  const result = h("div", {});
  const trials = h("div", {});
  const decisions = h("div", {});

  function draw() {
    details.replaceChildren(runFacts(run));
    result.replaceChildren(resultFacts(run.result));
    trials.replaceChildren(trialsTable(run));
    decisions.replaceChildren(decisionsList(run));
    fill(
      errorLine,
      run.error ? h("p", { class: "error-text" }, h("strong", {}, `Error (${run.error.type}): `), run.error.message) : null,
    );
    note.textContent = ACTIVE.has(run.status)
      ? `The run is ${run.status} (${run.phase}); this page updates every ${POLL_MS / 1000} seconds.`
      : `The run ${run.status}.`;
  }

  async function poll() {
    if (signal.aborted) return;
    try {
      const latest = await get(path);
      if (signal.aborted) return;
      run = latest;
      draw();
      if (ACTIVE.has(run.status)) setTimeout(poll, POLL_MS);
    } catch (error) {
      if (!signal.aborted) showError(error);
    }
  }

  draw();
  if (ACTIVE.has(run.status)) setTimeout(poll, POLL_MS);
  return [
    ...heading(`Auto run ${run.id}`, `Searches for the best version of ${run.model} on its benchmark.`),
    note,
    errorLine,
    details,
    section("Result on held-out", result),
    section("Trials", trials),
    section("Decisions", decisions),
  ];
}
