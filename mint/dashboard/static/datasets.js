// Datasets: the JSONL files jobs train on, and a form to upload one (`POST /v1/datasets`,
// multipart). The API validates every row and stores the file only if all are valid; its
// message names the first bad row.

import { all, upload } from "./api.js";
import { bytes, code, facts, h, heading, link, number, section, table, when } from "./dom.js";
import { apiForm, field, formPanel, select } from "./forms.js";

function uploadForm() {
  const file = h("input", { id: "dataset-file", name: "file", type: "file", accept: ".jsonl,.json,application/jsonl" });
  const kind = select("dataset-kind", [
    ["", "read from the first row"],
    ["chat", "chat (supervised)"],
    ["preference", "preference (DPO)"],
    ["prompts", "prompts (reinforcement)"],
  ]);
  return apiForm({
    id: "upload-dataset",
    title: "Upload a dataset",
    description: "A JSONL file, one row per line: chat rows train supervised jobs, preference rows DPO, prompts RL.",
    fields: [field("JSONL file", file), field("Kind", kind)],
    actions: h("button", { type: "submit" }, "Upload"),
    action: async () => {
      if (!file.files.length) throw new Error("Choose a JSONL file to upload.");
      const form = new FormData();
      form.append("file", file.files[0], file.files[0].name);
      if (kind.value) form.append("kind", kind.value);
      const dataset = await upload("/v1/datasets", form);
      location.hash = `#/datasets/${encodeURIComponent(dataset.id)}`;
    },
  });
}

function datasetsTable(datasets, caption) {
  return table(
    caption,
    [
      ["Dataset", (dataset) => code(dataset.id)],
      ["File", (dataset) => dataset.filename],
      ["Kind", (dataset) => dataset.kind],
      ["Rows", (dataset) => number(dataset.row_count), "num"],
      ["Size", (dataset) => bytes(dataset.size_bytes), "num"],
      [
        "Source",
        (dataset) =>
          dataset.source_eval_run_id
            ? link(`#/evals/${dataset.source_eval_run_id}`, `failures of ${dataset.source_eval_run_id}`)
            : "upload",
      ],
      ["Train on it", (dataset) => link(`#/jobs/new/${encodeURIComponent(dataset.id)}`, "Start a job…")],
      ["Uploaded", (dataset) => when(dataset.created_at)],
    ],
    datasets,
    { empty: "No datasets yet: upload a JSONL file with the form above." },
  );
}

function uploaded(dataset) {
  return section(
    `Uploaded ${dataset.filename}`,
    facts([
      ["Id", h("code", { id: "uploaded-dataset" }, dataset.id)],
      ["Kind", dataset.kind],
      ["Rows", number(dataset.row_count)],
      ["Size", bytes(dataset.size_bytes)],
    ]),
    h(
      "p",
      {},
      h("a", { class: "button-link", href: `#/jobs/new/${encodeURIComponent(dataset.id)}` }, "Fine-tune on it…"),
    ),
  );
}

export async function renderDatasets() {
  return datasetsPage(null);
}

// `/datasets/<id>`, right after an upload: that one first, then the list.
export async function renderUploaded(datasetId) {
  return datasetsPage(datasetId);
}

async function datasetsPage(justUploaded) {
  const datasets = await all("/v1/datasets", {}, 500);
  const fresh = justUploaded ? datasets.find((dataset) => dataset.id === justUploaded) : null;
  return [
    ...heading("Datasets", "JSONL files that fine-tuning jobs train on, newest first."),
    fresh ? uploaded(fresh) : null,
    formPanel(uploadForm(), !datasets.length),
    datasetsTable(datasets, "Datasets, newest first"),
  ];
}
