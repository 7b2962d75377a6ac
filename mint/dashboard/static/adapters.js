// Adapters and their immutable versions: each version's model reference (what evals and
// deployments name), its kind (a LoRA adapter, or a whole model a full-parameter job trained),
// its size and hash, the job that trained it and its metrics.

import { ApiError, all, get, storedKey } from "./api.js";
import { bytes, code, facts, h, heading, link, number, section, status, table, when } from "./dom.js";
import { showError } from "./ui.js";

export async function renderAdapters() {
  const adapters = await all("/v1/adapters");
  const versions = await Promise.all(
    adapters.map((adapter) => get(`/v1/adapters/${encodeURIComponent(adapter.id)}/versions`)),
  );
  return [
    ...heading("Adapters", "LoRA adapters trained or uploaded in your organization, each with immutable versions."),
    table(
      "Adapters, newest first",
      [
        ["Name", (adapter) => link(`#/adapters/${adapter.id}`, adapter.name)],
        ["Base model", (adapter) => adapter.base_model],
        ["Versions", (adapter) => number(adapter.versions.length), "num"],
        ["Newest", (adapter) => (adapter.versions.length ? code(adapter.versions[0].model) : "—")],
        ["Created", (adapter) => when(adapter.created_at)],
      ],
      adapters.map((adapter, index) => ({ ...adapter, versions: versions[index] })),
      { empty: "No adapters yet: a fine-tuning job makes one when it succeeds." },
    ),
  ];
}

function metricsText(metrics) {
  const shown = Object.entries(metrics ?? {}).filter(([, value]) => typeof value === "number");
  return shown.map(([name, value]) => `${name.replaceAll("_", " ")} ${+value.toPrecision(4)}`).join(", ") || "—";
}

// A whole model is evaluated and downloaded, but not deployed on multi-LoRA serving nodes.
function kindText(version) {
  return version.kind === "full" ? "whole model (not deployable)" : "LoRA";
}

export async function renderAdapter(adapterId) {
  const [adapter, versions] = await Promise.all([
    get(`/v1/adapters/${encodeURIComponent(adapterId)}`),
    get(`/v1/adapters/${encodeURIComponent(adapterId)}/versions`),
  ]);
  return [
    ...heading(`Adapter ${adapter.name}`, adapter.description),
    facts([
      ["Id", code(adapter.id)],
      ["Base model", adapter.base_model],
      ["Created", when(adapter.created_at)],
    ]),
    section(
      "Versions",
      table(
        "Versions, newest first",
        [
          ["Model", (version) => code(version.model)],
          ["Kind", (version) => kindText(version)],
          ["Status", (version) => status(version.status)],
          ["Rank", (version) => version.rank, "num"],
          ["Alpha", (version) => version.alpha, "num"],
          ["Size", (version) => bytes(version.size_bytes), "num"],
          ["sha256", (version) => code(version.sha256.slice(0, 16))],
          [
            "Job",
            (version) =>
              version.training_job_id ? link(`#/jobs/${version.training_job_id}`, version.training_job_id) : "uploaded",
          ],
          ["Metrics", (version) => metricsText(version.metrics)],
          [
            "Lineage",
            (version) => link(`#/adapters/${adapter.id}/versions/${version.version}`, `Lineage of ${version.model}`),
          ],
          ["Created", (version) => when(version.created_at)],
          [
            "Download",
            (version) =>
              h(
                "button",
                {
                  type: "button",
                  class: "secondary small",
                  "aria-label": `Download the ${version.kind === "full" ? "model" : "PEFT"} files of ${version.model}`,
                  onclick: () => download(adapter, version),
                },
                "Download",
              ),
          ],
        ],
        versions,
        { empty: "No versions yet." },
      ),
    ),
  ];
}

// How a version came to be: it and the versions it was trained from, oldest first.
function origin(version) {
  if (version.training_job_id) return version.metrics?.method ?? "trained";
  if (version.metrics?.uploaded) return "uploaded";
  if (version.metrics?.tinker_path) return "Tinker sampler weights";
  return "—";
}

export async function renderLineage(adapterId, number) {
  const chain = await get(`/v1/adapters/${encodeURIComponent(adapterId)}/versions/${number}/lineage`);
  const last = chain[chain.length - 1];
  return [
    ...heading(
      `Lineage of ${last.model}`,
      "The version and the versions it was trained from (warm starts, earlier stages), oldest first.",
    ),
    table(
      "Lineage, oldest first",
      [
        ["Model", (version) => link(`#/adapters/${version.adapter_id}`, version.model)],
        ["How", (version) => origin(version)],
        [
          "Job",
          (version) =>
            version.training_job_id ? link(`#/jobs/${version.training_job_id}`, version.training_job_id) : "—",
        ],
        ["Training file", (version) => (version.metrics?.training_file ? code(version.metrics.training_file) : "—")],
        ["Status", (version) => status(version.status)],
        ["Metrics", (version) => metricsText(version.metrics)],
        ["Created", (version) => when(version.created_at)],
      ],
      chain,
    ),
  ];
}

// The download needs the key in a header, so it goes through fetch and a temporary object URL.
async function download(adapter, version) {
  try {
    const response = await fetch(
      `/v1/adapters/${encodeURIComponent(adapter.id)}/versions/${version.version}/download`,
      {
        headers: { Authorization: `Bearer ${storedKey()}` },
      },
    );
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      const detail = body.error ?? {};
      throw new ApiError(
        response.status,
        detail.type ?? "http_error",
        detail.message ?? "The download failed.",
        detail.param,
        body,
      );
    }
    const url = URL.createObjectURL(await response.blob());
    const anchor = h("a", { href: url, download: `${adapter.name}-v${version.version}.tar` });
    document.body.append(anchor);
    anchor.click();
    anchor.remove();
    URL.revokeObjectURL(url);
  } catch (error) {
    showError(error);
  }
}
