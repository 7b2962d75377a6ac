// Tinker training runs (models made through the Tinker API: the official SDK, the cookbook)
// and their checkpoints: saved states, sampler weights (also adapter versions) and exported
// weights, with whether each is published and when it expires.

import { ApiError, get } from "./api.js";
import { bytes, code, facts, heading, link, section, status, table, when } from "./dom.js";

const path = (model) => `/api/v1/training_runs/${encodeURIComponent(model)}`;

export async function renderRuns() {
  const page = await get("/api/v1/training_runs", { limit: 100 });
  return [
    ...heading("Tinker runs", "Models trained through the Tinker API (tinker SDK, tinker-cookbook), newest first."),
    table(
      "Tinker runs, newest first",
      [
        ["Run", (run) => link(`#/tinker/${run.training_run_id}`, run.training_run_id)],
        ["Base model", (run) => run.base_model],
        ["Rank", (run) => run.lora_rank ?? "—", "num"],
        ["Last request", (run) => when(run.last_request_time)],
        ["Last state", (run) => (run.last_checkpoint ? code(run.last_checkpoint.tinker_path) : "—")],
        [
          "Last sampler weights",
          (run) => (run.last_sampler_checkpoint ? code(run.last_sampler_checkpoint.tinker_path) : "—"),
        ],
      ],
      page.training_runs,
      { empty: "No Tinker runs yet: point the tinker SDK at this server (TINKER_BASE_URL) with a Mint key." },
    ),
  ];
}

// A model's id is `<session>:train:<n>`; its session's samplers include those made from its
// unnamed sampler weights (`save_weights_and_get_sampling_client`), which are not checkpoints.
async function sessionSamplers(modelId) {
  const cut = modelId.lastIndexOf(":train:");
  if (cut < 0) return [];
  try {
    const session = await get(`/api/v1/sessions/${encodeURIComponent(modelId.slice(0, cut))}`);
    return await Promise.all(
      session.sampler_ids.map((id) => get(`/api/v1/samplers/${encodeURIComponent(id)}`)),
    );
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return [];
    throw error;
  }
}

function samplerSource(sampler) {
  if (sampler.model_path) return code(sampler.model_path);
  return "unnamed: the base, or weights saved for sampling without a name";
}

export async function renderRun(modelId) {
  const [run, listed, samplers] = await Promise.all([
    get(path(modelId)),
    get(`${path(modelId)}/checkpoints`),
    sessionSamplers(modelId),
  ]);
  const unnamed = samplers.filter((sampler) => !sampler.model_path).length;
  const empty = unnamed
    ? "No checkpoints. Weights saved for sampling without a name (save_weights_and_get_sampling_client) " +
      "make a sampler of the session, listed below, not a checkpoint; save_state, save_weights_for_sampler " +
      "with a name, and save_weights_external make checkpoints."
    : "No checkpoints: save_state, save_weights_for_sampler with a name, and save_weights_external make them.";
  return [
    ...heading(`Tinker run ${run.training_run_id}`, "Its checkpoints, oldest first, and its session's samplers."),
    facts([
      ["Base model", run.base_model],
      ["LoRA rank", run.lora_rank ?? "—"],
      ["Last request", when(run.last_request_time)],
    ]),
    section(
      "Checkpoints",
      table(
        "Checkpoints, oldest first",
        [
          ["Path", (checkpoint) => code(checkpoint.tinker_path)],
          ["Type", (checkpoint) => checkpoint.checkpoint_type],
          ["Size", (checkpoint) => bytes(checkpoint.size_bytes), "num"],
          ["Published", (checkpoint) => status(checkpoint.public ? "public" : "private")],
          ["Expires", (checkpoint) => (checkpoint.expires_at ? when(checkpoint.expires_at) : "never")],
          ["Saved", (checkpoint) => when(checkpoint.time)],
        ],
        listed.checkpoints,
        { empty },
      ),
    ),
    section(
      "Samplers of its session",
      table(
        "Samplers, oldest first",
        [
          ["Sampler", (sampler) => code(sampler.sampler_id)],
          ["Base model", (sampler) => sampler.base_model],
          ["Weights", samplerSource],
        ],
        samplers,
        { empty: "No samplers: the session sampled nothing." },
      ),
    ),
  ];
}
