// Tinker training runs (models made through the Tinker API: the official SDK, the cookbook)
// and their checkpoints: saved states, sampler weights (also adapter versions) and exported
// weights, with whether each is published and when it expires.

import { get } from "./api.js";
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

export async function renderRun(modelId) {
  const [run, listed] = await Promise.all([get(path(modelId)), get(`${path(modelId)}/checkpoints`)]);
  return [
    ...heading(`Tinker run ${run.training_run_id}`, "Its checkpoints, oldest first."),
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
        { empty: "No checkpoints yet: save_state, save_weights_for_sampler and save_weights_external make them." },
      ),
    ),
  ];
}
