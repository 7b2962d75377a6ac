// Benchmarks and eval runs: the benchmark list and page (versions, runs, and a form to compare
// two runs of one version), the run list, a run's page with its trajectory browser, and the
// comparison of two runs (before/after chart per task, accuracy difference with its
// confidence interval from `/v1/evals/compare`).

import { all, get, post } from "./api.js";
import { beforeAfterChart } from "./charts.js";
import {
  code,
  facts,
  fill,
  h,
  heading,
  link,
  number,
  percent,
  section,
  signedPoints,
  status,
  table,
  when,
} from "./dom.js";
import { apiForm, baseNames, field, formPanel, input, numberOf, select, suggestions, textOf, versionModels } from "./forms.js";
import { message } from "./messages.js";
import { showError } from "./ui.js";

const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const POLL_MS = 2000;
const TRAJECTORY_PAGE = 50;

async function benchmarkNames() {
  const benchmarks = await all("/v1/benchmarks");
  return new Map(benchmarks.map((benchmark) => [benchmark.id, benchmark.name]));
}

function runsTable(caption, runs, names, empty = "No eval runs yet: start one with the form above.") {
  return table(
    caption,
    [
      ["Run", (run) => link(`#/evals/${run.id}`, run.id)],
      ["Status", (run) => status(run.status)],
      ["Model", (run) => run.model],
      [
        "Benchmark",
        (run) =>
          link(
            `#/benchmarks/${run.benchmark_id}`,
            `${names.get(run.benchmark_id) ?? run.benchmark_id} v${run.version}`,
          ),
      ],
      ["Split", (run) => run.split ?? "all"],
      ["Accuracy", (run) => percent(run.metrics.accuracy), "num"],
      [
        "Passed",
        (run) => (run.metrics.tasks === undefined ? "—" : `${run.metrics.passed}/${run.metrics.tasks}`),
        "num",
      ],
      ["Mean steps", (run) => number(run.metrics.mean_steps, 2), "num"],
      ["Created", (run) => when(run.created_at)],
    ],
    runs,
    { empty },
  );
}

// ---- benchmarks ----------------------------------------------------------------------------

const GRADERS = [
  ["", "per task (each task names its own)"],
  ["exact", "exact: the output equals the reference"],
  ["normalized", "normalized: equal after case and spacing"],
  ["numeric", "numeric: the same number"],
  ["json_match", "json_match: the same JSON"],
  ["tool_call", "tool_call: the expected tool call"],
];
const BUILTINS = ["arithmetic", "format", "tool_calling", "triage"];
const FORMAT_OF_SUFFIX = { jsonl: "jsonl", json: "jsonl", yaml: "yaml", yml: "yaml" };

function benchmarkForm() {
  const name = input("benchmark-name", { maxlength: 200, required: true });
  const description = input("benchmark-description", { maxlength: 2000 });
  const source = select("benchmark-source", [
    ["file", "a file of tasks (JSONL or YAML)"],
    ["builtin", "a built-in benchmark"],
  ]);
  const file = h("input", { id: "benchmark-file", name: "benchmark-file", type: "file", accept: ".jsonl,.json,.yaml,.yml" });
  const grader = select("benchmark-grader", GRADERS);
  const builtin = select("benchmark-builtin", BUILTINS);
  const count = input("benchmark-n", { type: "number", min: 1, step: 1, inputmode: "numeric" });
  const split = select("benchmark-split", [
    ["", "both (train and heldout)"],
    ["train", "train"],
    ["heldout", "heldout"],
  ]);
  const fromFile = h(
    "fieldset",
    { id: "benchmark-from-file" },
    h("legend", {}, "Tasks from a file"),
    field("Tasks file", file, "One task a line (JSONL) or a YAML list: messages, and a reference or a grader."),
    field("Grader", grader, "Grades the tasks that do not name their own."),
  );
  const fromBuiltin = h(
    "fieldset",
    { id: "benchmark-from-builtin", hidden: true },
    h("legend", {}, "A built-in benchmark"),
    field("Built-in", builtin),
    field("Tasks per split", count, "Blank: the API's default."),
    field("Split", split),
  );
  source.addEventListener("change", () => {
    fromFile.hidden = source.value !== "file";
    fromBuiltin.hidden = source.value !== "builtin";
  });
  return apiForm({
    id: "create-benchmark",
    title: "Create a benchmark",
    description: "Its tasks become version 1; a version an eval run used never changes.",
    fields: [field("Name", name, "Letters, digits, . _ -; unique in the organization."), field("Description", description), field("Tasks from", source), fromFile, fromBuiltin],
    actions: h("button", { type: "submit" }, "Create the benchmark"),
    action: async () => {
      const body = { name: name.value.trim(), description: description.value.trim() || undefined };
      if (source.value === "file") {
        if (!file.files.length) throw new Error("Choose a file of tasks (JSONL or YAML).");
        const chosen = file.files[0];
        body.content = await chosen.text();
        body.format =
          FORMAT_OF_SUFFIX[chosen.name.split(".").pop().toLowerCase()] ??
          (body.content.trimStart().startsWith("{") ? "jsonl" : "yaml");
        if (grader.value) body.grader = { type: grader.value };
      } else {
        body.builtin = builtin.value;
        body.n = numberOf(count);
        body.split = split.value || undefined;
      }
      const created = await post("/v1/benchmarks", body);
      location.hash = `#/benchmarks/${encodeURIComponent(created.id)}`;
    },
  });
}

export async function renderBenchmarks() {
  const benchmarks = await all("/v1/benchmarks");
  return [
    ...heading("Benchmarks", "Immutable versions of tasks that eval runs score models on."),
    formPanel(benchmarkForm(), !benchmarks.length),
    table(
      "Benchmarks of your organization",
      [
        ["Name", (benchmark) => link(`#/benchmarks/${benchmark.id}`, benchmark.name)],
        ["Description", (benchmark) => benchmark.description || "—"],
        ["Latest version", (benchmark) => (benchmark.latest_version ? `v${benchmark.latest_version.version}` : "—")],
        ["Tasks", (benchmark) => number(benchmark.latest_version?.task_count), "num"],
        ["Created", (benchmark) => when(benchmark.created_at)],
      ],
      benchmarks,
      { empty: "No benchmarks yet: create one with the form above." },
    ),
  ];
}

function runLabel(run) {
  return `${run.model} · ${run.id} · ${percent(run.metrics.accuracy)}`;
}

function compareForm(runs) {
  const finished = runs.filter((run) => run.status === "succeeded");
  if (finished.length < 2)
    return h("p", { class: "empty" }, "Two finished runs of the same version are needed to compare.");
  const byVersion = new Map();
  for (const run of finished) {
    if (!byVersion.has(run.version)) byVersion.set(run.version, []);
    byVersion.get(run.version).push(run);
  }
  const options = (selected) =>
    [...byVersion.entries()].map(([version, versionRuns]) =>
      h(
        "optgroup",
        { label: `Version ${version}` },
        versionRuns.map((run) => h("option", { value: run.id, selected: run.id === selected }, runLabel(run))),
      ),
    );
  // Default: on the newest version with two runs, its oldest run before its newest.
  const pair = [...byVersion.values()].find((versionRuns) => versionRuns.length >= 2) ?? finished;
  const before = h("select", { id: "compare-a", name: "a", required: true }, options(pair.at(-1).id));
  const after = h("select", { id: "compare-b", name: "b", required: true }, options(pair[0].id));
  const form = h(
    "form",
    { class: "stacked-form", "aria-label": "Compare two runs" },
    h("div", {}, h("label", { for: "compare-a" }, "Before (run A)"), before),
    h("div", {}, h("label", { for: "compare-b" }, "After (run B)"), after),
    h("button", { type: "submit" }, "Compare"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = `#/compare/${encodeURIComponent(before.value)}/${encodeURIComponent(after.value)}`;
  });
  return form;
}

export async function renderBenchmark(benchmarkId) {
  const [benchmark, versions, runs] = await Promise.all([
    get(`/v1/benchmarks/${encodeURIComponent(benchmarkId)}`),
    all(`/v1/benchmarks/${encodeURIComponent(benchmarkId)}/versions`),
    all("/v1/evals", { benchmark_id: benchmarkId }),
  ]);
  const names = new Map([[benchmark.id, benchmark.name]]);
  return [
    ...heading(`Benchmark ${benchmark.name}`, benchmark.description),
    facts([
      ["Id", code(benchmark.id)],
      ["Created", when(benchmark.created_at)],
      ["Latest version", benchmark.latest_version ? `v${benchmark.latest_version.version}` : "—"],
    ]),
    section(
      "Versions",
      table(
        "Versions, newest first",
        [
          ["Version", (version) => `v${version.version}`],
          ["Tasks", (version) => number(version.task_count), "num"],
          [
            "Splits",
            (version) =>
              Object.entries(version.splits)
                .map(([name, count]) => `${name}: ${count}`)
                .join(", ") || "—",
          ],
          ["Grader", (version) => version.grader?.type ?? "per task"],
          ["Content sha256", (version) => code(version.sha256.slice(0, 16))],
          ["Locked", (version) => when(version.locked_at)],
        ],
        versions,
      ),
    ),
    section("Compare two runs", compareForm(runs)),
    section(
      "Eval runs",
      h(
        "p",
        {},
        h("a", { class: "button-link", href: `#/evals/new/${encodeURIComponent(benchmark.id)}` }, "Evaluate a model on it…"),
      ),
      runsTable(
        "Eval runs of this benchmark, newest first",
        runs,
        names,
        "No eval runs of it yet: evaluate a model on it with the link above.",
      ),
    ),
  ];
}

// ---- eval runs ----------------------------------------------------------------------------

function evalForm(benchmarks, models, preselected) {
  if (!benchmarks.length)
    return h(
      "p",
      { class: "empty", id: "eval-form-empty" },
      "An eval run scores a model on a benchmark: ",
      link("#/benchmarks", "create a benchmark"),
      " first.",
    );
  const benchmark = select(
    "eval-benchmark",
    benchmarks.map((item) => [item.id, `${item.name}${item.latest_version ? ` (v${item.latest_version.version}, ${item.latest_version.task_count} tasks)` : ""}`]),
  );
  if (preselected && benchmarks.some((item) => item.id === preselected)) benchmark.value = preselected;
  const model = input("eval-model", { list: "eval-models", maxlength: 300, required: true });
  const split = input("eval-split", { maxlength: 50 });
  const maxTokens = input("eval-max-tokens", { type: "number", min: 1, step: 1, inputmode: "numeric", placeholder: "256" });
  const temperature = input("eval-temperature", { type: "number", min: 0, max: 2, step: "any", placeholder: "0" });
  return apiForm({
    id: "start-eval",
    title: "Start an eval run",
    description: "Score a base model or an adapter version on a benchmark's newest version.",
    fields: [
      field("Benchmark", benchmark),
      field("Model", model, "A base (e.g. a name below) or an adapter version, name@N."),
      suggestions("eval-models", models),
      field("Split", split, "Only this split's tasks; blank: all."),
      field("Max tokens", maxTokens, "Largest assistant turn; blank: 256."),
      field("Temperature", temperature, "0 decodes greedily; blank: 0."),
    ],
    actions: h("button", { type: "submit" }, "Start the eval run"),
    action: async () => {
      const run = await post("/v1/evals", {
        benchmark_id: benchmark.value,
        model: model.value.trim(),
        split: textOf(split),
        max_tokens: numberOf(maxTokens),
        temperature: numberOf(temperature),
      });
      location.hash = `#/evals/${encodeURIComponent(run.id)}`;
    },
  });
}

async function runsPage(preselected) {
  const [runs, benchmarks, bases, versions] = await Promise.all([
    all("/v1/evals", {}, 500),
    all("/v1/benchmarks"),
    baseNames(),
    versionModels(),
  ]);
  const names = new Map(benchmarks.map((benchmark) => [benchmark.id, benchmark.name]));
  return [
    ...heading("Eval runs", "Models scored on benchmark versions, newest first."),
    formPanel(evalForm(benchmarks, [...versions, ...bases], preselected), !runs.length || Boolean(preselected)),
    runsTable("Eval runs, newest first", runs, names),
  ];
}

export async function renderRuns() {
  return runsPage(null);
}

// `/evals/new/<benchmark>`: the eval runs page with the form open on that benchmark.
export async function renderNewRun(benchmarkId) {
  return runsPage(benchmarkId);
}

function trajectory(item) {
  const verdict = item.passed ? "passed" : "failed";
  return h(
    "li",
    { class: `trajectory ${verdict}`, dataset: { task: item.task_id, passed: String(item.passed) } },
    h(
      "details",
      {},
      h(
        "summary",
        {},
        h("span", { class: "task-id" }, item.task_id),
        h("span", { class: `badge badge-${verdict}` }, verdict),
        h("span", {}, `score ${number(item.score, 2)}`),
        h("span", {}, `${item.steps} step${item.steps === 1 ? "" : "s"}`),
        h("span", {}, `${item.tokens_in} in / ${item.tokens_out} out tokens`),
        h("span", {}, `${number(item.latency_ms)} ms`),
      ),
      h("ol", { class: "messages", "aria-label": `Messages of ${item.task_id}` }, item.messages.map((entry, index) => message(entry, index + 1))),
      h("p", { class: "output" }, h("strong", {}, "Output: "), item.output ? code(item.output) : "(empty)"),
      item.error ? h("p", { class: "error-text" }, h("strong", {}, "Error: "), item.error) : null,
    ),
  );
}

function trajectoryBrowser(run) {
  const list = h("ol", { class: "trajectories", id: "trajectories", "aria-label": "Trajectories" });
  const summary = h("p", { class: "count-line", id: "trajectory-count", "aria-live": "polite" });
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load more");
  const failedOnly = h("input", { type: "checkbox", id: "failed-only", name: "failed-only" });
  let cursor = null;
  let generation = 0;

  async function load(reset) {
    const mine = reset ? ++generation : generation;
    if (reset) cursor = null;
    try {
      const page = await get(`/v1/evals/${encodeURIComponent(run.id)}/trajectories`, {
        limit: TRAJECTORY_PAGE,
        after: cursor,
        passed: failedOnly.checked ? "false" : null,
      });
      if (mine !== generation) return;
      if (reset) list.replaceChildren();
      list.append(...page.data.map(trajectory));
      cursor = page.last_id;
      more.hidden = !page.has_more;
      const shown = list.children.length;
      const filter = failedOnly.checked ? "failed " : "";
      summary.textContent = `Showing ${shown} ${filter}trajector${shown === 1 ? "y" : "ies"}${page.has_more ? " (more to load)" : ""}.`;
    } catch (error) {
      showError(error);
    }
  }

  failedOnly.addEventListener("change", () => load(true));
  more.addEventListener("click", () => load(false));
  load(true);
  return section(
    "Trajectories",
    h("div", { class: "filters" }, failedOnly, h("label", { for: "failed-only" }, "Failed only")),
    summary,
    list,
    more,
  );
}

function runFacts(run, benchmarkName) {
  const metrics = run.metrics ?? {};
  return [
    facts([
      ["Status", status(run.status)],
      ["Model", code(run.model)],
      ["Base model", run.base_model],
      ["Benchmark", link(`#/benchmarks/${run.benchmark_id}`, `${benchmarkName ?? run.benchmark_id} v${run.version}`)],
      ["Split", run.split ?? "all"],
      ["Max tokens", run.config?.max_tokens],
      ["Temperature", run.config?.temperature],
      ["Created", when(run.created_at)],
      ["Started", when(run.started_at)],
      ["Finished", when(run.finished_at)],
    ]),
    run.error
      ? h("p", { class: "error-text" }, h("strong", {}, "Error: "), run.error.message ?? JSON.stringify(run.error))
      : null,
    section(
      "Metrics",
      facts([
        ["Accuracy", percent(metrics.accuracy)],
        ["Passed", metrics.tasks === undefined ? "—" : `${metrics.passed} of ${metrics.tasks}`],
        ["Errors", number(metrics.errors)],
        ["Mean score", number(metrics.mean_score, 3)],
        ["Mean steps", number(metrics.mean_steps, 2)],
        ["Mean tokens in", number(metrics.mean_tokens_in, 1)],
        ["Mean tokens out", number(metrics.mean_tokens_out, 1)],
        ["Mean latency", metrics.mean_latency_ms === undefined ? "—" : `${number(metrics.mean_latency_ms)} ms`],
        ["Tasks per second", number(metrics.tasks_per_s, 2)],
      ]),
    ),
  ];
}

export async function renderRun(runId, { signal }) {
  const path = `/v1/evals/${encodeURIComponent(runId)}`;
  const [run, names] = await Promise.all([get(path), benchmarkNames()]);
  const details = h("div", {}, runFacts(run, names.get(run.benchmark_id)));
  const browser = h("div", {}, trajectoryBrowser(run));
  // While the run goes on, its numbers and trajectories are refreshed.
  async function poll(previous) {
    if (signal.aborted || FINISHED.has(previous.status)) return;
    try {
      const latest = await get(path);
      if (signal.aborted) return;
      fill(details, runFacts(latest, names.get(latest.benchmark_id)));
      // The trajectory list (and the filter someone may have set) is rebuilt once, at the end.
      if (FINISHED.has(latest.status)) browser.replaceChildren(trajectoryBrowser(latest));
      else setTimeout(() => poll(latest), POLL_MS);
    } catch (error) {
      if (!signal.aborted) showError(error);
    }
  }
  setTimeout(() => poll(run), POLL_MS);
  return [
    ...heading(
      `Eval run ${run.id}`,
      `${run.model} on ${names.get(run.benchmark_id) ?? run.benchmark_id} v${run.version}`,
    ),
    details,
    browser,
  ];
}

// ---- comparison ---------------------------------------------------------------------------

// `mean_tokens_in` -> "Mean tokens in".
function sentence(name) {
  const words = name.replaceAll("_", " ");
  return words[0].toUpperCase() + words.slice(1);
}

const OUTCOMES = [
  ["fixed", "Fixed (failed before, passes after)"],
  ["broken", "Broken (passed before, fails after)"],
  ["still_passing", "Still passing"],
  ["still_failing", "Still failing"],
];

export async function renderComparison(a, b) {
  const [runA, runB, comparison] = await Promise.all([
    get(`/v1/evals/${encodeURIComponent(a)}`),
    get(`/v1/evals/${encodeURIComponent(b)}`),
    get("/v1/evals/compare", { a, b }),
  ]);
  const [before, after, names] = await Promise.all([
    all(`/v1/evals/${encodeURIComponent(a)}/trajectories`, {}, 5000),
    all(`/v1/evals/${encodeURIComponent(b)}/trajectories`, {}, 5000),
    benchmarkNames(),
  ]);
  const outcome = new Map();
  for (const [key] of OUTCOMES) for (const task of comparison[key]) outcome.set(task, key);
  const scoresBefore = new Map(before.map((item) => [item.task_id, item.score]));
  const scoresAfter = new Map(after.map((item) => [item.task_id, item.score]));
  const order = OUTCOMES.map(([key]) => key);
  const tasks = [...new Set([...scoresBefore.keys(), ...scoresAfter.keys()])].sort((x, y) => {
    const rank = (task) => (outcome.has(task) ? order.indexOf(outcome.get(task)) : order.length);
    return rank(x) - rank(y) || x.localeCompare(y);
  });
  const categories = tasks.map((task) => ({
    name: task,
    outcome: outcome.get(task) ?? "only_one_run",
    before: scoresBefore.get(task) ?? null,
    after: scoresAfter.get(task) ?? null,
  }));
  const interval = comparison.interval;
  const benchmarkName = names.get(runA.benchmark_id) ?? runA.benchmark_id;
  const efficiency = Object.entries(comparison.efficiency_delta);
  return [
    ...heading(
      "Comparison",
      `${runB.model} (after) against ${runA.model} (before) on ${benchmarkName} v${runA.version}`,
    ),
    section(
      "Result",
      h(
        "ul",
        { class: "cards", "aria-label": "Comparison numbers" },
        h(
          "li",
          { class: "card" },
          h("span", { class: "count", id: "accuracy-before" }, percent(comparison.a.accuracy)),
          h("span", { class: "card-label" }, `before: ${runA.model}`),
        ),
        h(
          "li",
          { class: "card" },
          h("span", { class: "count", id: "accuracy-after" }, percent(comparison.b.accuracy)),
          h("span", { class: "card-label" }, `after: ${runB.model}`),
        ),
        h(
          "li",
          { class: `card ${comparison.significant ? "significant" : ""}` },
          h("span", { class: "count", id: "accuracy-delta" }, signedPoints(comparison.accuracy_delta)),
          h("span", { class: "card-label" }, "accuracy difference"),
        ),
      ),
      h(
        "p",
        { id: "interval" },
        `${Math.round(interval.confidence * 100)}% confidence interval of the difference (paired bootstrap, ${number(interval.resamples)} resamples): `,
        h("strong", {}, `[${signedPoints(interval.low)}, ${signedPoints(interval.high)}]`),
        ". ",
        comparison.significant
          ? "The difference is significant: the interval excludes zero."
          : "Not significant: the interval includes zero.",
      ),
      facts([
        ["Tasks compared", number(comparison.tasks)],
        ...OUTCOMES.map(([key, label]) => [label, number(comparison[key].length)]),
        ["Only in run A", number(comparison.only_in_a)],
        ["Only in run B", number(comparison.only_in_b)],
        ["Mean score difference", number(comparison.mean_score_delta, 3)],
        ...efficiency.map(([name, value]) => [`${sentence(name)} difference`, number(value, 2)]),
      ]),
      h(
        "p",
        {},
        "Runs: ",
        link(`#/evals/${runA.id}`, `A ${runA.id}`),
        " · ",
        link(`#/evals/${runB.id}`, `B ${runB.id}`),
      ),
    ),
    section(
      "Before and after, per task",
      h(
        "figure",
        { class: "chart-figure" },
        beforeAfterChart({
          title: `Score per task: ${runA.model} before, ${runB.model} after`,
          categories,
          beforeLabel: runA.model,
          afterLabel: runB.model,
        }),
        h("figcaption", {}, "Each task's score before (top bar) and after (bottom bar); tasks grouped by outcome."),
      ),
      table(
        "Scores per task",
        [
          ["Task", (item) => item.name],
          [
            "Outcome",
            (item) => h("span", { class: `badge outcome-${item.outcome}` }, item.outcome.replaceAll("_", " ")),
          ],
          ["Before", (item) => number(item.before, 2), "num"],
          ["After", (item) => number(item.after, 2), "num"],
        ],
        categories,
      ),
    ),
  ];
}
