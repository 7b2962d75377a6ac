// Forms that change things through the REST API, with the signed-in key like every other call.
// The API checks what is sent: a refusal (a 4xx) is shown next to its form in the API's own
// words, and the fields keep what the person typed. The choices a form offers (bases, datasets,
// benchmarks, adapter versions) are read from the API too.

import { all, ApiError, get } from "./api.js";
import { fill, h } from "./dom.js";

// A labelled control, with an optional hint under it.
export function field(label, control, hint) {
  const hintId = hint ? `${control.id}-hint` : null;
  if (hintId) control.setAttribute("aria-describedby", hintId);
  return h(
    "div",
    { class: "field" },
    h("label", { for: control.id }, label),
    control,
    hint ? h("small", { class: "hint", id: hintId }, hint) : null,
  );
}

export function input(id, attributes = {}) {
  return h("input", { id, name: id, type: "text", autocomplete: "off", spellcheck: "false", ...attributes });
}

// `options` are [value, label] pairs, or plain values.
export function select(id, options, attributes = {}) {
  return h(
    "select",
    { id, name: id, ...attributes },
    options.map((option) => {
      const [value, label] = Array.isArray(option) ? option : [option, option];
      return h("option", { value }, label);
    }),
  );
}

// Suggestions for a text input (it still takes any value).
export function suggestions(id, values) {
  return h(
    "datalist",
    { id },
    values.map((value) => h("option", { value })),
  );
}

// A number field's value, or undefined when it is empty (the API's default then applies).
export function numberOf(control) {
  const text = control.value.trim();
  return text === "" ? undefined : Number(text);
}

export function textOf(control) {
  const text = control.value.trim();
  return text === "" ? undefined : text;
}

function describe(error) {
  if (error instanceof ApiError) {
    const status = error.status ? `${error.status} ${error.type}: ` : "";
    return `${status}${error.describe()}`;
  }
  return error.message || String(error);
}

export function showFormError(area, error) {
  fill(area, h("strong", {}, "Error: "), describe(error));
  area.hidden = false;
}

export function clearFormError(area) {
  area.replaceChildren();
  area.hidden = true;
}

// A form as a card: its title, its fields, and the place its errors are shown. On submit the
// buttons wait for `action(submitter)`; what it throws is shown in the form, whose fields keep
// their values. Returns the form; `form.errorArea` is the error line.
export function apiForm({ id, title, description, fields, actions, action }) {
  const area = h("p", { class: "form-error", id: `${id}-error`, role: "alert", hidden: true });
  const form = h(
    "form",
    { class: "stacked-form form-card", id, "aria-labelledby": `${id}-title`, novalidate: true },
    h("h3", { id: `${id}-title` }, title),
    description ? h("p", { class: "muted" }, description) : null,
    fields,
    h("div", { class: "form-actions" }, actions),
    area,
  );
  form.errorArea = area;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const buttons = [...form.querySelectorAll("button")];
    clearFormError(area);
    buttons.forEach((button) => {
      button.disabled = true;
    });
    form.setAttribute("aria-busy", "true");
    try {
      await action(event.submitter);
    } catch (error) {
      showFormError(area, error);
    } finally {
      buttons.forEach((button) => {
        button.disabled = false;
      });
      form.removeAttribute("aria-busy");
    }
  });
  return form;
}

// A form behind its title: open when the page has nothing else to show (its empty state), a
// click away otherwise.
export function formPanel(form, open) {
  // The summary takes the place (and the id) of the form's title, which names the form.
  const title = form.querySelector("h3");
  if (!title) return form;
  title.remove();
  return h(
    "details",
    { class: "form-panel", open: open || undefined, id: `${form.id}-panel` },
    h("summary", { id: title.id }, title.textContent),
    form,
  );
}

// ---- choices read from the API --------------------------------------------------------------

export async function baseNames() {
  const bases = await get("/v1/base_models");
  return bases.filter((base) => base.enabled).map((base) => base.name);
}

// Every adapter version's model reference (`name@N`), newest adapters first.
export async function versionModels() {
  const adapters = await all("/v1/adapters");
  const lists = await Promise.all(
    adapters.map((adapter) => get(`/v1/adapters/${encodeURIComponent(adapter.id)}/versions`)),
  );
  return lists.flat().map((version) => version.model);
}
