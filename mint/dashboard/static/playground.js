// The sampling playground: a message sent to any model the organization can use (a base,
// `adapter@version`, a deployment, or `tinker://<run>/sampler_weights/<name>`) through the
// OpenAI chat route, and the reply token by token: each token's logprob and the alternatives
// the model weighed at that step. The same numbers an OpenAI client reads (`logprobs`,
// `top_logprobs`), at temperature 1 whatever the sampling temperature.

import { get, request } from "./api.js";
import { code, fill, h, heading, number, section, table } from "./dom.js";
import { showError } from "./ui.js";

const TOP_ALTERNATIVES = 5;

// How sure the model was of a token, as a class that shades it (no inline styles under the CSP).
function certainty(logprob) {
  const probability = Math.exp(logprob);
  if (probability >= 0.5) return "token-sure";
  if (probability >= 0.1) return "token-unsure";
  return "token-surprising";
}

function reply(entries) {
  return h(
    "p",
    { class: "token-reply", "aria-label": "Reply, token by token" },
    entries.map((entry) =>
      h(
        "span",
        { class: `token ${certainty(entry.logprob)}`, title: `logprob ${number(entry.logprob, 4)}` },
        entry.token,
      ),
    ),
  );
}

function alternatives(entry) {
  return entry.top_logprobs.map((option) => `${JSON.stringify(option.token)} ${number(Math.exp(option.logprob), 3)}`);
}

function result(completion) {
  const choice = completion.choices[0];
  const entries = choice.logprobs?.content ?? [];
  const served = completion.mint?.adapter ?? completion.mint?.base_model ?? completion.model;
  return section(
    "Reply",
    h("p", {}, "Served by ", code(served), ` · ${completion.usage.completion_tokens} tokens · ${choice.finish_reason}`),
    reply(entries),
    table(
      "Tokens of the reply",
      [
        ["#", (entry) => entries.indexOf(entry) + 1, "num"],
        ["Token", (entry) => code(JSON.stringify(entry.token))],
        ["Logprob", (entry) => number(entry.logprob, 4), "num"],
        ["Probability", (entry) => number(Math.exp(entry.logprob), 3), "num"],
        ["Most likely at this step", (entry) => alternatives(entry).join(" · ")],
      ],
      entries,
      { empty: "The reply has no tokens." },
    ),
  );
}

function field(id, label, input) {
  return h("div", {}, h("label", { for: id }, label), input);
}

export async function render() {
  const models = await get("/v1/models");
  const names = h(
    "datalist",
    { id: "playground-models" },
    models.data.map((model) => h("option", { value: model.id })),
  );
  const model = h("input", {
    id: "playground-model",
    name: "model",
    list: "playground-models",
    required: true,
    placeholder: "a base, adapter@version, deployment or tinker:// path",
  });
  const message = h("textarea", { id: "playground-message", name: "message", rows: 3, required: true });
  const maxTokens = h("input", { id: "playground-max-tokens", type: "number", min: 1, max: 256, value: 16 });
  const temperature = h("input", {
    id: "playground-temperature",
    type: "number",
    min: 0,
    max: 2,
    step: 0.1,
    value: 0,
  });
  const output = h("div", { id: "playground-output", "aria-live": "polite" });
  const submit = h("button", { type: "submit" }, "Sample");
  const form = h(
    "form",
    { class: "stacked-form", "aria-label": "Sample a model" },
    names,
    field("playground-model", "Model", model),
    field("playground-message", "Message", message),
    field("playground-max-tokens", "Max tokens", maxTokens),
    field("playground-temperature", "Temperature", temperature),
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    try {
      const completion = await request("POST", "/v1/chat/completions", {
        body: {
          model: model.value.trim(),
          messages: [{ role: "user", content: message.value }],
          max_tokens: Number(maxTokens.value),
          temperature: Number(temperature.value),
          logprobs: true,
          top_logprobs: TOP_ALTERNATIVES,
        },
      });
      fill(output, result(completion));
    } catch (error) {
      fill(output);
      showError(error);
    } finally {
      submit.disabled = false;
    }
  });
  return [
    ...heading(
      "Playground",
      "Send a message to any model of this organization and read its reply token by token, with the alternatives.",
    ),
    form,
    output,
  ];
}
