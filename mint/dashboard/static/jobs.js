// Fine-tuning jobs: the list, and a job's page with its loss curve drawn from the `metrics`
// events (`/v1/fine_tuning/jobs/{id}/events`), its events and its checkpoints. A reinforcement
// job's page also draws its mean reward and shows its latest step's signal: the reward's spread,
// the share of groups with signal, KL to the base, entropy and clip fraction, and a few of the
// latest step's samples as the grader read them (text, reward, reference). While the job
// is not finished the page asks for new events every few seconds and redraws.

import { all, get, post } from "./api.js";
import { lineChart } from "./charts.js";
import { code, facts, fill, h, heading, link, money, number, percent, section, status, table, when } from "./dom.js";
import { apiForm, baseNames, field, formPanel, input, numberOf, select, textOf } from "./forms.js";
import { showError } from "./ui.js";

const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const POLL_MS = 2000;
const EVENT_PAGE = 100;
const SHOWN_EVENTS = 200;

function jobsTable(jobs) {
  return table(
    "Fine-tuning jobs, newest first",
    [
      ["Job", (job) => link(`#/jobs/${job.id}`, job.id)],
      ["Status", (job) => status(job.status)],
      ["Base", (job) => job.model],
      ["Method", (job) => job.method?.type ?? "supervised"],
      ["Steps", (job) => `${job.completed_steps}/${job.total_steps}`, "num"],
      ["Trained tokens", (job) => number(job.trained_tokens), "num"],
      ["Cost", (job) => money(job.cost_usd), "num"],
      ["Model", (job) => (job.fine_tuned_model ? code(job.fine_tuned_model) : "—")],
      ["Created", (job) => when(job.created_at)],
    ],
    jobs,
    { empty: "No fine-tuning jobs yet: start one with the form above." },
  );
}

// A range `low`–`high` after a value, when the estimate gives one (older platforms do not).
function range(low, high, format) {
  if (low === null || low === undefined || high === null || high === undefined) return "";
  return ` (likely ${format(low)} to ${format(high)})`;
}

const seconds = (value) => `${number(value)} s`;
const present = (value) => value !== null && value !== undefined;

// What the API expects a job to use and cost; every field past the required ones is optional.
export function estimateFacts(estimate) {
  const basis =
    estimate.basis === undefined || estimate.basis === null
      ? estimate.calibrated_on
        ? `calibrated on ${estimate.calibrated_on} finished jobs of this base and method`
        : "the platform's defaults (no job of this base and method has finished here yet)"
      : typeof estimate.basis === "string"
        ? estimate.basis
        : JSON.stringify(estimate.basis);
  return facts([
    [
      "Cost",
      h(
        "span",
        { id: "estimate-cost" },
        money(estimate.cost_usd),
        range(estimate.cost_usd_low, estimate.cost_usd_high, money),
      ),
    ],
    [
      "Time on one worker",
      h("span", { id: "estimate-time" }, seconds(estimate.seconds), range(estimate.seconds_low, estimate.seconds_high, seconds)),
    ],
    ["Optimizer steps", h("span", { id: "estimate-steps" }, number(estimate.steps))],
    ["Trained tokens", number(estimate.trained_tokens)],
    ["Sampled tokens", estimate.sampled_tokens ? number(estimate.sampled_tokens) : undefined],
    ["Basis", basis],
    [
      "Allowed",
      estimate.allowed_usd === null || estimate.allowed_usd === undefined
        ? "no budget or spend limit applies"
        : `${money(estimate.allowed_usd)} (${estimate.limited_by ?? "limit"})`,
    ],
  ]);
}

const METHODS = [
  ["supervised", "supervised (SFT): chat rows"],
  ["dpo", "DPO: preference rows"],
  ["reinforcement", "reinforcement (RL): prompt rows and a grader"],
];
const METHOD_OF_KIND = { chat: "supervised", preference: "dpo", prompts: "reinforcement" };

function jobForm(bases, datasets, preselected) {
  if (!datasets.length)
    return h(
      "p",
      { class: "empty", id: "job-form-empty" },
      "A job trains on a dataset: ",
      link("#/datasets", "upload one on the Datasets page"),
      " first.",
    );
  const model = select("job-model", bases);
  const file = select(
    "job-training-file",
    datasets.map((dataset) => [dataset.id, `${dataset.filename} · ${dataset.kind}, ${dataset.row_count} rows · ${dataset.id}`]),
  );
  if (preselected && datasets.some((dataset) => dataset.id === preselected)) file.value = preselected;
  const method = select("job-method", METHODS);
  const grader = h("textarea", { id: "job-grader", name: "job-grader", rows: 3, spellcheck: "false" });
  const graderField = field("Grader (JSON, reinforcement only)", grader, 'e.g. {"type": "regex", "config": {"pattern": "^OK"}}');
  const suffix = input("job-suffix", { maxlength: 64 });
  const steps = input("job-steps", { type: "number", min: 1, step: 1, inputmode: "numeric" });
  const batch = input("job-batch-size", { type: "number", min: 1, step: 1, inputmode: "numeric" });
  const learningRate = input("job-learning-rate", { type: "number", min: 0, step: "any" });
  const seed = input("job-seed", { type: "number", min: 0, step: 1, inputmode: "numeric" });
  const budget = input("job-budget", { type: "number", min: 0, step: "any" });
  const estimateBox = h("div", { id: "job-estimate", "aria-live": "polite" });
  const estimateButton = h("button", { type: "submit", value: "estimate", id: "job-estimate-button" }, "Estimate");
  const start = h("button", { type: "submit", value: "start", id: "job-start", hidden: true }, "Start the job");
  let estimated = null;

  const kindOf = () => datasets.find((dataset) => dataset.id === file.value)?.kind;
  const showGrader = () => {
    graderField.hidden = method.value !== "reinforcement";
  };
  method.value = METHOD_OF_KIND[kindOf()] ?? "supervised";
  showGrader();
  file.addEventListener("change", () => {
    method.value = METHOD_OF_KIND[kindOf()] ?? method.value;
    showGrader();
  });
  method.addEventListener("change", showGrader);

  function body() {
    const type = method.value;
    const hyperparameters = numberOf(batch) === undefined ? undefined : { batch_size: numberOf(batch) };
    const settings = { hyperparameters };
    if (type === "reinforcement" && grader.value.trim()) {
      try {
        settings.grader = JSON.parse(grader.value);
      } catch (error) {
        throw new Error(`The grader is not valid JSON: ${error.message}`);
      }
    }
    return {
      model: model.value,
      training_file: file.value,
      suffix: textOf(suffix),
      steps: numberOf(steps),
      learning_rate: numberOf(learningRate),
      seed: numberOf(seed),
      budget_usd: numberOf(budget),
      method: { type, [type]: settings },
    };
  }

  const form = apiForm({
    id: "start-job",
    title: "Start a fine-tuning job",
    description: "See what it is estimated to cost and take first; then start it.",
    fields: [
      field("Base model", model),
      field("Training file", file, h("span", {}, "Another file? ", link("#/datasets", "Upload it"), ".")),
      field("Method", method),
      graderField,
      field("Adapter name (suffix)", suffix, "Its versions are named suffix@1, suffix@2, …; blank: named after the job."),
      field("Steps", steps, "Optimizer steps; blank: from the epochs."),
      field("Batch size", batch, "Rows per step; blank: auto."),
      field("Learning rate", learningRate, "Blank: the base's default for the method."),
      field("Seed", seed),
      field("Budget (USD)", budget, "The most it may cost; blank: only the organization's spend limits."),
      estimateBox,
    ],
    actions: [estimateButton, start],
    action: async (submitter) => {
      const request = body();
      const asked = JSON.stringify(request);
      if (submitter?.value === "start") {
        if (asked !== estimated) throw new Error("The fields changed since the estimate: estimate again.");
        const job = await post("/v1/fine_tuning/jobs", request);
        location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
        return;
      }
      const estimate = await post("/v1/fine_tuning/jobs/estimate", request);
      estimated = asked;
      fill(estimateBox, h("h4", {}, "Estimate"), estimateFacts(estimate));
      start.hidden = false;
    },
  });
  // A changed field makes the estimate stale: estimate again before starting.
  const stale = () => {
    if (estimated === null) return;
    estimated = null;
    start.hidden = true;
    fill(estimateBox, h("p", { class: "muted" }, "The fields changed: estimate again to start."));
  };
  form.addEventListener("input", stale);
  form.addEventListener("change", stale);
  return form;
}

async function jobsPage(preselected) {
  const [jobs, bases, datasets] = await Promise.all([all("/v1/fine_tuning/jobs", {}, 500), baseNames(), all("/v1/datasets", {}, 500)]);
  return [
    ...heading("Fine-tuning jobs", "Supervised, DPO and reinforcement jobs, newest first."),
    formPanel(jobForm(bases, datasets, preselected), !jobs.length || Boolean(preselected)),
    jobsTable(jobs),
  ];
}

export async function renderJobs() {
  return jobsPage(null);
}

// `/jobs/new/<dataset>`: the jobs page with the form open on that dataset.
export async function renderNewJob(datasetId) {
  return jobsPage(datasetId);
}

// Events newer than `newestId` (all when null), newest first, walking back page by page.
async function eventsSince(jobId, newestId) {
  const fresh = [];
  let after;
  for (;;) {
    const page = await get(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/events`, { limit: EVENT_PAGE, after });
    for (const event of page.data) {
      if (newestId !== null && Number(event.id) <= newestId) return fresh;
      fresh.push(event);
    }
    if (!page.has_more || !page.data.length) return fresh;
    after = page.data.at(-1).id;
  }
}

function jobFacts(job) {
  const method = job.method?.type ?? "supervised";
  const hyperparameters = job.method?.[method]?.hyperparameters ?? job.hyperparameters ?? {};
  return facts([
    ["Status", h("span", { id: "job-status" }, status(job.status))],
    ["Base model", job.model],
    ["Method", method],
    ["Training", job.training_type === "full" ? "full parameters (billed by device time)" : "LoRA"],
    ["Progress", h("span", { id: "job-progress" }, `${job.completed_steps} of ${job.total_steps} steps`)],
    ["Trained tokens", number(job.trained_tokens)],
    ["Cost", h("span", { id: "job-cost" }, money(job.cost_usd))],
    [
      "Estimate",
      job.estimate
        ? `${money(job.estimate.cost_usd)}${range(job.estimate.cost_usd_low, job.estimate.cost_usd_high, money)}, ` +
          `${number(job.estimate.trained_tokens)} tokens, ` +
          `${seconds(job.estimate.seconds)}${range(job.estimate.seconds_low, job.estimate.seconds_high, seconds)}` +
          (job.estimate.calibrated_on ? ` (calibrated on ${job.estimate.calibrated_on} jobs)` : " (uncalibrated)")
        : "—",
    ],
    // Optional fields: shown where the platform reports them.
    ["Running for", present(job.elapsed_s) ? h("span", { id: "job-elapsed" }, seconds(job.elapsed_s)) : undefined],
    [
      "Time left",
      present(job.eta_s) && !FINISHED.has(job.status) ? h("span", { id: "job-eta" }, `about ${seconds(job.eta_s)}`) : undefined,
    ],
    ["Budget", job.budget_usd === null || job.budget_usd === undefined ? "none" : money(job.budget_usd)],
    ["Training file", code(job.training_file)],
    [
      "LoRA",
      Object.entries(job.lora ?? {})
        .filter(([, value]) => value !== null)
        .map(([name, value]) => `${name} ${JSON.stringify(value)}`)
        .join(", ") || "defaults",
    ],
    [
      "Hyperparameters",
      Object.entries(hyperparameters)
        .map(([name, value]) => `${name} ${value}`)
        .join(", ") || "defaults",
    ],
    ["Seed", job.seed],
    ["Result", job.fine_tuned_model ? h("a", { href: "#/adapters" }, code(job.fine_tuned_model)) : "—"],
    ["Attempts", number(job.attempts)],
    ["Created", when(job.created_at)],
    ["Started", when(job.started_at)],
    ["Finished", when(job.finished_at)],
  ]);
}

// [step, value] of one metric, in step order; a resumed job may report a step twice and its
// latest report stands.
function metricPoints(events, name) {
  return events
    .filter((event) => event.type === "metrics" && typeof event.data[name] === "number")
    .map((event) => [event.data.step, event.data[name]])
    .sort((x, y) => x[0] - y[0])
    .filter((point, index, points) => index === points.length - 1 || points[index + 1][0] !== point[0]);
}

// What shows whether RL can learn, at the newest step reported.
function signalFacts(events) {
  const latest = events.find((event) => event.type === "metrics" && typeof event.data.reward === "number");
  if (!latest) return h("p", { class: "poll-note" }, "The first step's signal appears when it ends.");
  const data = latest.data;
  return h(
    "div",
    { id: "rl-signal" },
    facts([
      ["Step", number(data.step)],
      ["Reward", `${number(data.reward, 3)} ± ${number(data.reward_std, 3)}`],
      ["Groups with signal", h("span", { id: "groups-with-signal" }, percent(data.groups_with_signal, 0))],
      ["KL to the base", number(data.kl, 4)],
      ["Entropy", number(data.entropy, 3)],
      ["Clip fraction", percent(data.clip_fraction, 0)],
      ["Tokens sampled", number(data.tokens)],
    ]),
  );
}

// A few samples of the newest step that carries them: the text as graded, its reward, the
// reference and the grader's reason.
function samplesTable(events) {
  const latest = events.find((event) => event.type === "metrics" && Array.isArray(event.data.samples));
  return table(
    latest ? `Samples of step ${latest.data.step}, as graded` : "Samples, as graded",
    [
      ["Output", (sample) => h("pre", { class: "sample-text" }, sample.text)],
      ["Reward", (sample) => number(sample.reward, 3), "num"],
      ["Reference", (sample) => (sample.reference === undefined ? "—" : code(sample.reference))],
      ["Grader says", (sample) => sample.detail ?? "—"],
    ],
    latest ? latest.data.samples : [],
    { empty: "The samples appear when the first step ends." },
  );
}

function eventsTable(events) {
  return table(
    `Events, newest first${events.length > SHOWN_EVENTS ? ` (the newest ${SHOWN_EVENTS})` : ""}`,
    [
      ["Time", (event) => when(event.created_at)],
      ["Level", (event) => h("span", { class: `level level-${event.level}` }, event.level)],
      ["Type", (event) => event.type],
      ["Message", (event) => event.message],
    ],
    events.slice(0, SHOWN_EVENTS),
    { empty: "No events yet." },
  );
}

function lossCaption(count, jobStatus) {
  const finished = FINISHED.has(jobStatus);
  if (!count)
    return finished ? `The job ${jobStatus} before its first optimizer step.` : "The curve appears with the first optimizer step.";
  const steps = `${count} optimizer step${count === 1 ? "" : "s"}`;
  return finished ? `Loss at each of its ${steps}.` : `Loss at each of ${steps} reported so far.`;
}

export async function renderJob(jobId, { signal }) {
  const path = `/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}`;
  let [job, events] = await Promise.all([get(path), eventsSince(jobId, null)]);
  const checkpoints = h("div", {});
  const details = h("div", {}, jobFacts(job));
  const curve = h("figure", { class: "chart-figure", id: "loss-curve" });
  const rewardCurve = h("figure", { class: "chart-figure", id: "reward-curve" });
  const signalLine = h("div", {});
  const samples = h("div", { id: "rl-samples" });
  const reinforcement = job.method?.type === "reinforcement";
  const note = h("p", { class: "poll-note", id: "poll-note" });
  const log = h("div", {}, eventsTable(events));
  const errorLine = h("div", {});

  async function drawCheckpoints() {
    const page = await get(`${path}/checkpoints`);
    checkpoints.replaceChildren(
      table(
        "Checkpoints, newest first",
        [
          ["Step", (checkpoint) => number(checkpoint.step_number), "num"],
          ["Checkpoint", (checkpoint) => code(checkpoint.fine_tuned_model_checkpoint)],
          ["Saved", (checkpoint) => when(checkpoint.created_at)],
        ],
        page.data,
        { empty: "No checkpoints saved." },
      ),
    );
  }

  function draw() {
    const points = metricPoints(events, "loss");
    curve.replaceChildren(
      lineChart({ title: `Training loss of ${job.id}`, xLabel: "step", yLabel: "loss", points }),
      h(
        "figcaption",
        {},
        lossCaption(points.length, job.status),
      ),
    );
    if (reinforcement) {
      const rewards = metricPoints(events, "reward");
      rewardCurve.replaceChildren(
        lineChart({ title: `Mean reward of ${job.id}`, xLabel: "step", yLabel: "reward", points: rewards }),
        h(
          "figcaption",
          {},
          rewards.length
            ? `Mean reward of the samples at each of ${rewards.length} steps.`
            : "The curve appears with the first optimizer step.",
        ),
      );
      signalLine.replaceChildren(signalFacts(events));
      samples.replaceChildren(samplesTable(events));
    }
    details.replaceChildren(jobFacts(job));
    log.replaceChildren(eventsTable(events));
    fill(
      errorLine,
      job.error
        ? h("p", { class: "error-text" }, h("strong", {}, `Error (${job.error.code}): `), job.error.message)
        : null,
    );
    note.textContent = FINISHED.has(job.status)
      ? `The job ${job.status}.`
      : `The job is ${job.status.replaceAll("_", " ")}; this page updates every ${POLL_MS / 1000} seconds.`;
  }

  async function poll() {
    if (signal.aborted) return;
    try {
      const newest = events.length ? Number(events[0].id) : null;
      const [latest, fresh] = await Promise.all([get(path), eventsSince(jobId, newest)]);
      if (signal.aborted) return;
      job = latest;
      events = [...fresh, ...events];
      draw();
      if (FINISHED.has(job.status)) await drawCheckpoints();
      else setTimeout(poll, POLL_MS);
    } catch (error) {
      if (!signal.aborted) showError(error);
    }
  }

  draw();
  await drawCheckpoints();
  if (!FINISHED.has(job.status)) setTimeout(poll, POLL_MS);
  return [
    ...heading(
      `Job ${job.id}`,
      job.suffix ? `Trains adapter ${job.suffix} on ${job.model}.` : `Trains on ${job.model}.`,
    ),
    note,
    errorLine,
    details,
    section("Loss curve", curve),
    ...(reinforcement ? [section("Reward and signal", rewardCurve, signalLine), section("Samples", samples)] : []),
    section("Checkpoints", checkpoints),
    section("Events", log),
  ];
}
