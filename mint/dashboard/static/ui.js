// What every page shares besides data: the alert area (errors from the API with their
// message, notices after a change) and the confirmation dialog asked before a change.

import { ApiError } from "./api.js";
import { fill, h } from "./dom.js";

function alerts() {
  return document.getElementById("alerts");
}

function dismissable(kind, ...content) {
  const alert = h("div", { class: `alert alert-${kind}` });
  alert.append(
    h("p", {}, ...content),
    h("button", { type: "button", class: "secondary small", onclick: () => alert.remove() }, "Dismiss"),
  );
  alerts().append(alert);
  return alert;
}

export function showError(error) {
  const message = error instanceof ApiError ? error.describe() : error.message || String(error);
  const status = error instanceof ApiError && error.status ? `${error.status} ${error.type}: ` : "";
  return dismissable("error", h("strong", {}, "Error: "), status, message);
}

export function showNotice(text) {
  return dismissable("notice", text);
}

export function clearAlerts() {
  alerts().replaceChildren();
}

// Ask before a change. Resolves to the reason typed (a string, possibly empty) when the
// person confirms, or to null when they cancel (the button or Escape).
export function confirmAction({ title, body, confirmLabel }) {
  const dialog = document.getElementById("confirm");
  dialog.querySelector("#confirm-title").textContent = title;
  fill(dialog.querySelector("#confirm-body"), body);
  dialog.querySelector("#confirm-ok").textContent = confirmLabel;
  const reason = dialog.querySelector("#confirm-reason");
  reason.value = "";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm" ? reason.value : null), {
      once: true,
    });
    dialog.showModal();
    dialog.querySelector("#confirm-cancel").focus();
  });
}
