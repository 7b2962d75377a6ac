// Fine-tuning jobs: the list, and a job's page with its loss curve drawn from the `metrics`
// events (`/v1/fine_tuning/jobs/{id}/events`), its events and its checkpoints. A reinforcement
// job's page also draws its mean reward and shows its latest step's signal: the reward's spread,
// the share of groups with signal, KL to the base, entropy and clip fraction, and a few of the
// latest step's samples as the grader read them (text, reward, reference). An online RL job's
// page (`method: online_rl`, learning from a deployment's rewarded episodes) draws the same
// reward curve and signal, and adds what the episodes gave each step (used, stale, late,
// unrewarded, the wait), the share of groups with signal per step, and the versions it
// published (from its `Step n: published X@k` events) and whether the deployment serves them.
// While the job is not finished the page asks for new events every few seconds and redraws.

import { all, get, post } from "./api.js";
import { lineChart } from "./charts.js";
import { code, facts, fill, h, heading, link, money, number, percent, section, status, table, when } from "./dom.js";
import { apiForm, baseNames, field, formPanel, input, numberOf, select, textOf } from "./forms.js";
import { episodeHref } from "./episodes.js";
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
        .filter(([, value]) => value !== null && value !== undefined)
        .map(([name, value]) => `${name} ${typeof value === "object" ? JSON.stringify(value) : value}`)
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

// What shows whether RL can learn, at the newest step reported; an online job's also says what
// the deployment's episodes gave that step.
function signalFacts(events, online = false) {
  const latest = events.find((event) => event.type === "metrics" && typeof event.data.reward === "number");
  if (!latest)
    return h(
      "p",
      { class: "poll-note" },
      online
        ? "The first step's signal appears when enough rewarded episodes have come and the step ends."
        : "The first step's signal appears when it ends.",
    );
  const data = latest.data;
  return h(
    "div",
    { id: "rl-signal" },
    facts([
      ["Step", number(data.step)],
      ["Reward", `${number(data.reward, 3)} ± ${number(data.reward_std, 3)}`],
      ["Groups with signal", h("span", { id: "groups-with-signal" }, percent(data.groups_with_signal, 0))],
      ["Episodes used", online ? h("span", { id: "episodes-used" }, number(data.episodes)) : undefined],
      ["Stale (dropped)", online ? number(data.episodes_stale) : undefined],
      ["Rewarded too late (so far)", online ? number(data.episodes_late) : undefined],
      ["Unrewarded past the timeout (so far)", online ? number(data.episodes_unrewarded) : undefined],
      ["Waited for episodes", online && present(data.wait_s) ? seconds(data.wait_s) : undefined],
      ["KL to the base", number(data.kl, 4)],
      ["Entropy", number(data.entropy, 3)],
      ["Clip fraction", percent(data.clip_fraction, 0)],
      [online ? "Tokens served in its episodes" : "Tokens sampled", number(data.tokens)],
    ]),
  );
}

// Each step's report, newest first (a step reported twice, by a resumed job: its latest report).
function stepReports(events) {
  const seen = new Set();
  const reports = [];
  for (const event of events) {
    if (event.type !== "metrics" || typeof event.data.step !== "number" || seen.has(event.data.step)) continue;
    seen.add(event.data.step);
    reports.push(event.data);
  }
  return reports.sort((x, y) => y.step - x.step);
}

// An online job's steps: the reward and signal of each, and what its episodes were.
function onlineStepsTable(events) {
  return table(
    "Steps, newest first",
    [
      ["Step", (data) => number(data.step), "num"],
      ["Reward", (data) => number(data.reward, 3), "num"],
      ["Groups with signal", (data) => percent(data.groups_with_signal, 0), "num"],
      ["Episodes", (data) => number(data.episodes), "num"],
      ["Stale", (data) => number(data.episodes_stale), "num"],
      ["Late", (data) => number(data.episodes_late), "num"],
      ["Unrewarded", (data) => number(data.episodes_unrewarded), "num"],
      ["Waited", (data) => (present(data.wait_s) ? seconds(data.wait_s) : "—"), "num"],
      ["Published", (data) => (data.published ? "yes" : "no")],
    ],
    stepReports(events),
    { empty: "No step has ended yet.", rowAttributes: (data) => ({ dataset: { step: String(data.step) } }) },
  );
}

// The versions an online job published, newest first: from its `Step n: published X@k` events
// (data: step, model, adapter_version_id, served), and the version the job ended with (its
// result, served when an event says `The deployment now serves X`, data: model alone).
function publishedVersions(job, events) {
  const seen = new Set();
  const rows = [];
  for (const event of events) {
    const data = event.data ?? {};
    if (typeof data.model !== "string" || typeof data.served !== "boolean") continue;
    const key = data.adapter_version_id ?? data.model;
    if (seen.has(key)) continue;
    seen.add(key);
    rows.push({ step: data.step, model: data.model, served: data.served, created_at: event.created_at });
  }
  const result = job.fine_tuned_model;
  if (result && !rows.some((row) => row.model === result)) {
    const servedBy = events.find(
      (event) => event.data?.model === result && event.data.adapter_version_id === undefined,
    );
    rows.unshift({
      step: null,
      model: result,
      served: Boolean(servedBy),
      created_at: servedBy?.created_at ?? job.finished_at,
    });
  }
  return rows;
}

function publishedTable(job, events) {
  return table(
    "Published versions, newest first",
    [
      ["Step", (row) => (row.step === null ? `${number(job.total_steps)} (the job's end)` : number(row.step)), "num"],
      ["Version", (row) => code(row.model)],
      [
        "Served",
        (row) =>
          h(
            "span",
            { class: `badge badge-${row.served ? "passed" : "pending"}` },
            row.served ? "served" : "registered, not served",
          ),
      ],
      ["When", (row) => when(row.created_at)],
    ],
    publishedVersions(job, events),
    {
      empty: "No version published yet.",
      rowAttributes: (row) => ({ dataset: { model: row.model, served: String(row.served) } }),
    },
  );
}

// The deployment an online job learns from (its id, in the job's method; or its name as the
// job's first event gives it), and how it serves what the job publishes.
function onlineDeployment(job, events) {
  const named = job.method?.online_rl?.deployment;
  if (named) return named;
  for (const event of events) {
    const found = /^Training from the live episodes of deployment (\S+)$/.exec(event.message ?? "");
    if (found) return found[1];
  }
  return null;
}

function learnsFromText(job, deployment) {
  if (!deployment) return "Learns from a deployment's rewarded episodes.";
  const serve = job.method?.online_rl?.serve;
  const how =
    serve === "register"
      ? "it registers each version it publishes, for a promotion through the deployment's gate"
      : "the deployment serves each version it publishes at once";
  return [
    "Learns from the rewarded episodes of deployment ",
    link(`#/deployments/${encodeURIComponent(deployment.id)}`, deployment.name),
    `; ${how}. The deployment's revision history shows the versions this job promoted.`,
  ];
}

// A few samples of the newest step that carries them: the text as graded, its reward, the
// reference and the grader's reason.
function sampleOutput(sample, online) {
  const episode = online ? /^episode (\S+)$/.exec(sample.text ?? "") : null;
  if (episode) return link(episodeHref(episode[1]), sample.text);
  return h("pre", { class: "sample-text" }, sample.text);
}

function samplesTable(events, online = false) {
  const latest = events.find((event) => event.type === "metrics" && Array.isArray(event.data.samples));
  return table(
    online
      ? latest
        ? `Episodes of step ${latest.data.step}, as rewarded`
        : "Episodes, as rewarded"
      : latest
        ? `Samples of step ${latest.data.step}, as graded`
        : "Samples, as graded",
    [
      ["Output", (sample) => sampleOutput(sample, online)],
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
  const online = job.method?.type === "online_rl";
  const reinforcement = job.method?.type === "reinforcement" || online;
  const signalCurve = h("figure", { class: "chart-figure", id: "signal-curve" });
  const steps = h("div", { id: "online-steps" });
  const published = h("div", { id: "published-versions" });
  const learnsFrom = h("p", { class: "muted", id: "online-deployment" });
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
      signalLine.replaceChildren(signalFacts(events, online));
      samples.replaceChildren(samplesTable(events, online));
    }
    if (online) {
      const signalPoints = metricPoints(events, "groups_with_signal");
      signalCurve.replaceChildren(
        lineChart({
          title: `Groups with signal of ${job.id}`,
          xLabel: "step",
          yLabel: "groups with signal",
          points: signalPoints,
        }),
        h(
          "figcaption",
          {},
          signalPoints.length
            ? `Share of task groups whose episodes' rewards differed, at each of ${signalPoints.length} steps.`
            : "The curve appears with the first optimizer step.",
        ),
      );
      steps.replaceChildren(onlineStepsTable(events));
      published.replaceChildren(publishedTable(job, events));
      fill(learnsFrom, learnsFromText(job, deployment));
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

  // An online job's deployment, by name where it can be read (it may be gone since).
  let deployment = null;
  if (online) {
    const named = onlineDeployment(job, events);
    if (named) {
      try {
        const found = await get(`/v1/deployments/${encodeURIComponent(named)}`);
        deployment = { id: found.id, name: found.name };
      } catch {
        deployment = { id: named, name: named };
      }
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
    ...(online ? [learnsFrom] : []),
    errorLine,
    details,
    section("Loss curve", curve),
    ...(reinforcement ? [section("Reward and signal", rewardCurve, signalLine)] : []),
    ...(online
      ? [
          section("Episodes per step", signalCurve, steps),
          section("Published versions", published),
          section("Episodes of the latest step", samples),
        ]
      : reinforcement
        ? [section("Samples", samples)]
        : []),
    section("Checkpoints", checkpoints),
    section("Events", log),
  ];
}
