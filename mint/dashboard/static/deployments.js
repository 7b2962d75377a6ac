// Deployments: the list, and a deployment's page: what it serves now, promote / roll back /
// withdraw (each asked for confirmation, with a reason), the revision history with the gate's
// verdict on every gated change and who made it (a person's key, or an online RL job that
// published and served a version), the traffic it captured with the feedback given on it, and
// the episodes it recorded (`episodes.js`).

import { all, get, patch, post } from "./api.js";
import { code, facts, fill, h, heading, link, percent, section, signedPoints, status, table, when } from "./dom.js";
import { apiForm, field, formPanel, input, numberOf, select, textOf, versionModels } from "./forms.js";
import { episodesSection } from "./episodes.js";
import { confirmAction, showError, showNotice } from "./ui.js";

function servingText(routing) {
  if (!routing) return "—";
  if (routing.model) return routing.model;
  if (routing.mixture)
    return `mixture of ${(routing.mixture.adapters ?? []).map((item) => item.model ?? item).join(", ")}`;
  return "nothing (withdrawn)";
}

function gateText(gate) {
  if (!gate) return "none";
  const parts = [`benchmark ${gate.benchmark}`];
  if (gate.min_pass_rate !== null && gate.min_pass_rate !== undefined)
    parts.push(`pass rate at least ${percent(gate.min_pass_rate)}`);
  if (gate.max_regression !== null && gate.max_regression !== undefined)
    parts.push(`regression at most ${signedPoints(gate.max_regression)}`);
  if (gate.require_no_significant_regression) parts.push("no significant regression");
  return parts.join("; ");
}

function createForm(models, benchmarks) {
  if (!models.length)
    return h(
      "p",
      { class: "empty", id: "deployment-form-empty" },
      "A deployment serves an adapter version: ",
      link("#/jobs", "fine-tune one"),
      " first.",
    );
  const name = input("deployment-name", { maxlength: 100, required: true });
  const model = select("deployment-model", models);
  const gateBenchmark = select("deployment-gate-benchmark", [
    ["", "no gate"],
    ...benchmarks.map((benchmark) => [benchmark.name, benchmark.name]),
  ]);
  const minPassRate = input("deployment-gate-min-pass-rate", { type: "number", min: 0, max: 100, step: "any" });
  const noRegression = h("input", { type: "checkbox", id: "deployment-gate-no-regression", name: "no-regression" });
  const reason = input("deployment-reason", { maxlength: 2000 });
  return apiForm({
    id: "create-deployment",
    title: "Create a deployment",
    description: "A stable model name that clients send; it serves the version chosen here until one is promoted.",
    fields: [
      field("Name", name, "What clients send as the model, e.g. support-prod (no @)."),
      field("Version to serve", model),
      field("Gate benchmark", gateBenchmark, "Every promotion must then pass an eval of the candidate on it."),
      field("Gate: least pass rate (%)", minPassRate, "Blank: no least pass rate."),
      h(
        "div",
        { class: "check" },
        noRegression,
        h("label", { for: "deployment-gate-no-regression" }, "Gate: refuse a significant regression"),
      ),
      field("Reason", reason, "Kept in the revision history and the audit log."),
    ],
    actions: h("button", { type: "submit" }, "Create the deployment"),
    action: async () => {
      const rate = numberOf(minPassRate);
      const gate = gateBenchmark.value
        ? {
            benchmark: gateBenchmark.value,
            min_pass_rate: rate === undefined ? undefined : rate / 100,
            require_no_significant_regression: noRegression.checked,
          }
        : undefined;
      const created = await post("/v1/deployments", {
        name: name.value.trim(),
        model: model.value,
        gate,
        reason: textOf(reason),
      });
      location.hash = `#/deployments/${encodeURIComponent(created.id)}`;
    },
  });
}

export async function renderDeployments() {
  const [deployments, models, benchmarks] = await Promise.all([
    all("/v1/deployments"),
    versionModels(),
    all("/v1/benchmarks"),
  ]);
  return [
    ...heading("Deployments", "Stable model names that serve an adapter version (or a mixture) to clients."),
    formPanel(createForm(models, benchmarks), !deployments.length),
    table(
      "Deployments, newest first",
      [
        ["Name", (deployment) => link(`#/deployments/${deployment.id}`, deployment.name)],
        ["Status", (deployment) => status(deployment.status)],
        ["Kind", (deployment) => deployment.kind],
        ["Base", (deployment) => deployment.base_model],
        ["Serving", (deployment) => servingText(deployment.serving?.routing)],
        ["Revision", (deployment) => deployment.current_revision],
        ["Gate", (deployment) => gateText(deployment.gate)],
        ["Updated", (deployment) => when(deployment.updated_at)],
      ],
      deployments,
      { empty: "No deployments yet: create one with the form above." },
    ),
  ];
}

function verdictCell(verdict) {
  if (!verdict) return h("span", { class: "muted" }, "no gate");
  const interval =
    verdict.interval_low === null || verdict.interval_low === undefined
      ? null
      : `interval [${signedPoints(verdict.interval_low)}, ${signedPoints(verdict.interval_high)}]`;
  return h(
    "div",
    { class: "verdict" },
    h(
      "span",
      { class: `badge badge-${verdict.passed ? "passed" : "failed"}` },
      verdict.passed ? "gate passed" : "gate refused",
    ),
    h(
      "span",
      {},
      [
        `pass rate ${percent(verdict.candidate_pass_rate)}`,
        verdict.production_pass_rate === null || verdict.production_pass_rate === undefined
          ? null
          : `production ${percent(verdict.production_pass_rate)}`,
        verdict.delta === null || verdict.delta === undefined ? null : `difference ${signedPoints(verdict.delta)}`,
        interval,
      ]
        .filter(Boolean)
        .join("; "),
    ),
    h("span", { class: "muted" }, verdict.reason),
  );
}

// The online RL job that made a revision: its reason names it ("online RL job <id>, step N",
// "online RL job <id> finished"); such a revision has no key of its own.
const ONLINE_JOB = /\bonline RL job (ftjob_[A-Za-z0-9]+)/;

function jobOf(revision) {
  return revision.created_by_key_id ? null : (ONLINE_JOB.exec(revision.reason ?? "")?.[1] ?? null);
}

function byCell(revision) {
  const job = jobOf(revision);
  if (job) return h("span", { class: "by-job" }, link(`#/jobs/${encodeURIComponent(job)}`, `job ${job}`));
  if (revision.created_by_key_id) return h("span", {}, "key ", code(revision.created_by_key_id));
  return h("span", { class: "muted" }, "the platform");
}

// One line per online RL job that changed what the deployment serves: how many versions it
// promoted, and the last.
function onlinePromotions(revisions) {
  const jobs = new Map();
  for (const revision of [...revisions].reverse()) {
    const job = jobOf(revision);
    if (!job) continue;
    const seen = jobs.get(job) ?? { count: 0, last: null };
    seen.count += 1;
    seen.last = revision;
    jobs.set(job, seen);
  }
  if (!jobs.size) return null;
  return h(
    "ul",
    { class: "online-promotions", id: "online-promotions", "aria-label": "Promotions by online RL jobs" },
    [...jobs].map(([job, seen]) =>
      h(
        "li",
        {},
        "Online RL ",
        link(`#/jobs/${encodeURIComponent(job)}`, `job ${job}`),
        ` promoted ${seen.count} version${seen.count === 1 ? "" : "s"}; the last, `,
        code(servingText(seen.last.routing)),
        `, at revision ${seen.last.revision} (`,
        when(seen.last.created_at),
        ").",
      ),
    ),
  );
}

function historyTable(revisions) {
  return table(
    "Revisions, newest first",
    [
      ["Revision", (revision) => revision.revision],
      ["Action", (revision) => revision.action],
      ["Serving", (revision) => servingText(revision.routing)],
      ["By", byCell],
      ["Gate verdict", (revision) => verdictCell(revision.gate_verdict)],
      ["Reason", (revision) => revision.reason || "—"],
      ["When", (revision) => when(revision.created_at)],
    ],
    revisions,
    {
      rowAttributes: (revision) => ({
        class: jobOf(revision) ? "by-online-job" : undefined,
        dataset: { revision: String(revision.revision), action: revision.action, job: jobOf(revision) ?? undefined },
      }),
    },
  );
}

async function candidateVersions(baseModel) {
  const adapters = (await all("/v1/adapters")).filter((adapter) => adapter.base_model === baseModel);
  const lists = await Promise.all(
    adapters.map((adapter) => get(`/v1/adapters/${encodeURIComponent(adapter.id)}/versions`)),
  );
  return lists.flat().map((version) => version.model);
}

function promoteForm(deployment, candidates, act) {
  if (deployment.kind !== "single") {
    const mixture = h(
      "textarea",
      { id: "promote-mixture", name: "mixture", rows: 6, required: true },
      JSON.stringify(deployment.serving?.routing?.mixture ?? {}, null, 2),
    );
    const form = h(
      "form",
      { class: "stacked-form", "aria-label": "Promote a mixture" },
      h("label", { for: "promote-mixture" }, "Mixture to serve (JSON)"),
      mixture,
      h("button", { type: "submit" }, "Promote…"),
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      let parsed;
      try {
        parsed = JSON.parse(mixture.value);
      } catch (error) {
        showError(new Error(`The mixture is not valid JSON: ${error.message}`));
        return;
      }
      act("promote", { mixture: parsed }, "Promote this mixture?", "The deployment will serve the mixture above.");
    });
    return form;
  }
  const current = deployment.serving?.routing?.model;
  const select = h(
    "select",
    { id: "promote-model", name: "model", required: true },
    candidates.map((model) => h("option", { value: model }, model === current ? `${model} (serving now)` : model)),
  );
  const preferred = candidates.find((model) => model !== current);
  if (preferred) select.value = preferred;
  const form = h(
    "form",
    { class: "stacked-form", "aria-label": "Promote a version" },
    h("label", { for: "promote-model" }, "Version to promote"),
    select,
    h("button", { type: "submit", id: "promote" }, "Promote…"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const gate = deployment.gate ? ` The gate (${gateText(deployment.gate)}) checks it first.` : "";
    act(
      "promote",
      { model: select.value },
      `Promote ${select.value}?`,
      `${deployment.name} will serve ${select.value} instead of ${servingText(deployment.serving?.routing)}.${gate}`,
    );
  });
  return form;
}

function rollbackForm(deployment, revisions, act) {
  const earlier = revisions.filter(
    (revision) => revision.revision < deployment.current_revision && revision.action !== "withdraw",
  );
  if (!earlier.length) return h("p", { class: "empty" }, "No earlier revision to roll back to.");
  const select = h(
    "select",
    { id: "rollback-revision", name: "to_revision" },
    earlier.map((revision) =>
      h("option", { value: revision.revision }, `revision ${revision.revision}: ${servingText(revision.routing)}`),
    ),
  );
  const form = h(
    "form",
    { class: "stacked-form", "aria-label": "Roll back" },
    h("label", { for: "rollback-revision" }, "Revision to serve again"),
    select,
    h("button", { type: "submit", id: "rollback", class: "warning" }, "Roll back…"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const target = earlier.find((revision) => String(revision.revision) === select.value);
    act(
      "rollback",
      { to_revision: Number(select.value) },
      `Roll back to revision ${select.value}?`,
      `${deployment.name} will serve ${servingText(target.routing)} again.`,
    );
  });
  return form;
}

function withdrawForm(deployment, act) {
  if (deployment.status !== "active") return h("p", { class: "empty" }, "Withdrawn: promote a version to serve again.");
  const button = h("button", { type: "button", id: "withdraw", class: "danger" }, "Withdraw…");
  button.addEventListener("click", () =>
    act(
      "withdraw",
      {},
      `Withdraw ${deployment.name}?`,
      "Clients sending this name get an error until a version is promoted again.",
    ),
  );
  return h("div", { class: "stacked-form" }, h("p", {}, "Stop serving under this name."), button);
}

function lastText(payload) {
  const messages = payload.messages ?? (payload.choices ?? []).map((choice) => choice.message ?? {});
  if (messages.length) {
    const last = messages.at(-1);
    return last.content ?? (last.tool_calls ? JSON.stringify(last.tool_calls) : "");
  }
  return payload.prompt ?? payload.choices?.[0]?.text ?? "";
}

function feedbackText(entries) {
  if (!entries.length) return "—";
  return entries
    .map((entry) =>
      [
        entry.score === null ? null : `score ${entry.score}`,
        entry.label,
        entry.comment,
        entry.correction ? `→ ${lastText({ choices: [entry.correction] }) || entry.correction.text}` : null,
      ]
        .filter(Boolean)
        .join(", "),
    )
    .join("; ");
}

function captureForm(deployment, capture, rebuild) {
  const rate = input("capture-rate", {
    type: "number",
    min: 0,
    max: 100,
    step: "any",
    value: String(+(100 * capture.rate).toFixed(4)),
  });
  const tokens = h("input", {
    type: "checkbox",
    id: "capture-tokens",
    name: "capture-tokens",
    checked: Boolean(capture.tokens),
    "aria-describedby": "capture-tokens-hint",
  });
  return apiForm({
    id: "set-capture",
    title: "Capture",
    fields: [
      field("Share of requests to record (%)", rate, "0 turns capture off."),
      h(
        "div",
        {},
        h(
          "div",
          { class: "check" },
          tokens,
          h("label", { for: "capture-tokens" }, "Record episodes token-exact (tokens)"),
        ),
        h(
          "small",
          { class: "hint", id: "capture-tokens-hint" },
          "The turns of requests marked X-Mint-Episode, with their token ids and logprobs: what online RL trains from.",
        ),
      ),
    ],
    actions: h("button", { type: "submit", class: "secondary" }, "Set capture"),
    action: async () => {
      const value = numberOf(rate);
      await patch(`/v1/deployments/${encodeURIComponent(deployment.id)}/capture`, {
        rate: value === undefined ? undefined : value / 100,
        tokens: tokens.checked,
      });
      await rebuild();
    },
  });
}

function captureSection(deployment, captures, rebuild) {
  const capture = deployment.capture ?? { rate: 0, retention_days: 30, tokens: false };
  const episodes = capture.tokens ? " Marked episodes are recorded token-exact." : "";
  const state =
    capture.rate > 0
      ? `Capturing ${percent(capture.rate, 0)} of requests, each kept ${capture.retention_days} days.${episodes}`
      : "Capture is off: set a share of requests below to record traffic.";
  return section(
    "Captured traffic",
    h("p", { class: "muted", id: "capture-state" }, state),
    captureForm(deployment, capture, rebuild),
    table(
      "Captured requests, newest first",
      [
        ["Completion", (c) => code(c.id)],
        ["Version", (c) => c.model],
        ["Asked", (c) => lastText(c.request)],
        ["Answered", (c) => lastText(c.response)],
        ["Latency", (c) => `${Math.round(c.latency_ms)} ms`, "num"],
        ["Feedback", (c) => feedbackText(c.feedback)],
        ["When", (c) => when(c.created_at)],
      ],
      captures,
      { empty: "No captured requests." },
    ),
  );
}

export async function renderDeployment(deploymentId) {
  const container = h("div", {});

  async function build() {
    const path = `/v1/deployments/${encodeURIComponent(deploymentId)}`;
    const [deployment, revisions, captured] = await Promise.all([
      get(path),
      get(`${path}/revisions`),
      get(`${path}/captures`, { limit: 50 }),
    ]);
    const candidates = deployment.kind === "single" ? await candidateVersions(deployment.base_model) : [];

    async function act(action, body, title, description) {
      const reason = await confirmAction({
        title,
        body: h("p", {}, description),
        confirmLabel: action === "rollback" ? "Roll back" : action[0].toUpperCase() + action.slice(1),
      });
      if (reason === null) return;
      try {
        const changed = await post(`/v1/deployments/${encodeURIComponent(deployment.id)}/${action}`, {
          ...body,
          reason,
        });
        showNotice(
          `${deployment.name}: revision ${changed.current_revision} (${action}) now serves ${servingText(changed.serving?.routing)}.`,
        );
      } catch (error) {
        showError(error);
      }
      await rebuild();
    }

    return [
      ...heading(`Deployment ${deployment.name}`, `Clients send model "${deployment.name}" to /v1/chat/completions.`),
      facts([
        ["Id", code(deployment.id)],
        ["Status", status(deployment.status)],
        ["Kind", deployment.kind],
        ["Base model", deployment.base_model],
        ["Serving", h("span", { id: "serving" }, servingText(deployment.serving?.routing))],
        ["Current revision", h("span", { id: "current-revision" }, String(deployment.current_revision))],
        ["Gate", gateText(deployment.gate)],
        ["Updated", when(deployment.updated_at)],
      ]),
      section(
        "Change what it serves",
        h(
          "div",
          { class: "actions-grid" },
          promoteForm(deployment, candidates, act),
          rollbackForm(deployment, revisions, act),
          withdrawForm(deployment, act),
        ),
      ),
      section("Revision history", onlinePromotions(revisions), historyTable(revisions)),
      captureSection(deployment, captured.data, rebuild),
      episodesSection(deployment),
    ];
  }

  async function rebuild() {
    try {
      fill(container, await build());
    } catch (error) {
      showError(error);
    }
  }

  fill(container, await build());
  return container;
}
