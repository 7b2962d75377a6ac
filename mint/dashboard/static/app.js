// The dashboard's shell: sign-in with an API key and the `#/...` router. Each page is a
// function of a module that takes the route's parameters and a context and returns the page's
// content; `context.signal` is aborted when the person leaves the page, which stops its polling.

import { forgetKey, get, onUnauthenticated, request, storedKey, storeKey } from "./api.js";
import { fill, h } from "./dom.js";
import { clearAlerts, showError } from "./ui.js";
import * as adapters from "./adapters.js";
import * as datasets from "./datasets.js";
import * as autotune from "./autotune.js";
import * as deployments from "./deployments.js";
import * as episodes from "./episodes.js";
import * as evals from "./evals.js";
import * as jobs from "./jobs.js";
import * as overview from "./overview.js";
import * as playground from "./playground.js";
import * as reviews from "./reviews.js";
import * as tinker from "./tinker.js";
import * as usage from "./usage.js";

// [pattern, page render function, title]
const ROUTES = [
  [/^\/$/, overview.render, "Overview"],
  [/^\/datasets$/, datasets.renderDatasets, "Datasets"],
  [/^\/datasets\/([^/]+)$/, datasets.renderUploaded, "Datasets"],
  [/^\/benchmarks$/, evals.renderBenchmarks, "Benchmarks"],
  [/^\/benchmarks\/([^/]+)$/, evals.renderBenchmark, "Benchmark"],
  [/^\/evals$/, evals.renderRuns, "Eval runs"],
  [/^\/evals\/new\/([^/]+)$/, evals.renderNewRun, "Eval runs"],
  [/^\/evals\/([^/]+)$/, evals.renderRun, "Eval run"],
  [/^\/compare\/([^/]+)\/([^/]+)$/, evals.renderComparison, "Comparison"],
  [/^\/reviews$/, reviews.renderQueues, "Review queues"],
  [/^\/reviews\/([^/]+)$/, reviews.renderQueue, "Review queue"],
  [/^\/jobs$/, jobs.renderJobs, "Jobs"],
  [/^\/jobs\/new\/([^/]+)$/, jobs.renderNewJob, "Jobs"],
  [/^\/jobs\/([^/]+)$/, jobs.renderJob, "Job"],
  [/^\/adapters$/, adapters.renderAdapters, "Adapters"],
  [/^\/adapters\/([^/]+)$/, adapters.renderAdapter, "Adapter"],
  [/^\/adapters\/([^/]+)\/versions\/(\d+)$/, adapters.renderLineage, "Lineage"],
  [/^\/autotune$/, autotune.renderRuns, "Auto runs"],
  [/^\/autotune\/([^/]+)$/, autotune.renderRun, "Auto run"],
  [/^\/tinker$/, tinker.renderRuns, "Tinker runs"],
  [/^\/tinker\/([^/]+)$/, tinker.renderRun, "Tinker run"],
  [/^\/deployments$/, deployments.renderDeployments, "Deployments"],
  [/^\/deployments\/([^/]+)$/, deployments.renderDeployment, "Deployment"],
  [/^\/episodes\/([^/]+)$/, episodes.renderEpisode, "Episode"],
  [/^\/playground$/, playground.render, "Playground"],
  [/^\/usage$/, usage.render, "Usage"],
];

const elements = {};
let current = null;

// ---- routing -----------------------------------------------------------------------------

function routeOf(hash) {
  const path = hash.startsWith("#/") ? hash.slice(1) : "/";
  for (const [pattern, render, title] of ROUTES) {
    const match = path.match(pattern);
    if (match) return { render, title, params: match.slice(1).map(decodeURIComponent), path };
  }
  return null;
}

function markCurrentLink(path) {
  const section = `/${path.split("/")[1] || ""}`;
  for (const anchor of elements.nav.querySelectorAll("a")) {
    const target = anchor.getAttribute("href").slice(1);
    const here =
      target === section ||
      (section === "/compare" && target === "/benchmarks") ||
      (section === "/episodes" && target === "/deployments");
    if (here) anchor.setAttribute("aria-current", "page");
    else anchor.removeAttribute("aria-current");
  }
}

async function show() {
  if (!storedKey()) return showSignIn();
  if (current) current.controller.abort();
  const route = routeOf(location.hash);
  const controller = new AbortController();
  current = { controller };
  clearAlerts();
  markCurrentLink(route ? route.path : "/");
  elements.view.setAttribute("aria-busy", "true");
  elements.view.replaceChildren(h("p", { class: "loading" }, "Loading…"));
  if (!route) {
    document.title = "Not found · Mint";
    elements.view.replaceChildren(
      h("h1", {}, "Not found"),
      h("p", {}, "This page does not exist. ", h("a", { href: "#/" }, "Back to the overview"), "."),
    );
    elements.view.removeAttribute("aria-busy");
    return;
  }
  document.title = `${route.title} · Mint`;
  try {
    const content = await route.render(...route.params, { signal: controller.signal });
    if (controller.signal.aborted) return;
    fill(elements.view, content);
  } catch (error) {
    if (controller.signal.aborted) return;
    elements.view.replaceChildren(
      h("h1", {}, route.title),
      h("p", { class: "empty" }, "This page could not be loaded."),
    );
    showError(error);
  } finally {
    if (!controller.signal.aborted) elements.view.removeAttribute("aria-busy");
  }
}

// ---- signing in and out ------------------------------------------------------------------

function showSignIn() {
  if (current) current.controller.abort();
  current = null;
  document.title = "Sign in · Mint";
  elements.nav.hidden = true;
  elements.account.hidden = true;
  elements.view.replaceChildren();
  elements.signIn.hidden = false;
  elements.keyInput.focus();
}

async function signIn(event) {
  event.preventDefault();
  const key = elements.keyInput.value.trim();
  clearAlerts();
  try {
    const organization = await request("GET", "/v1/organization", { key });
    storeKey(key);
    elements.keyInput.value = "";
    await enter(organization);
  } catch (error) {
    showError(error);
    elements.keyInput.focus();
  }
}

async function enter(organization) {
  elements.signIn.hidden = true;
  elements.nav.hidden = false;
  elements.account.hidden = false;
  elements.organization.textContent = `Organization: ${organization.name}`;
  await show();
}

function signOut() {
  forgetKey();
  clearAlerts();
  location.hash = "#/";
  showSignIn();
}

async function start() {
  for (const [name, id] of Object.entries({
    view: "view",
    nav: "nav",
    account: "account",
    organization: "organization",
    signIn: "sign-in",
  })) {
    elements[name] = document.getElementById(id);
  }
  elements.keyInput = document.getElementById("api-key");
  document.getElementById("sign-in-form").addEventListener("submit", signIn);
  document.getElementById("sign-out").addEventListener("click", signOut);
  document.querySelector(".skip-link").addEventListener("click", (event) => {
    event.preventDefault();
    document.getElementById("main").focus();
  });
  window.addEventListener("hashchange", () => {
    if (location.hash.startsWith("#/") && storedKey()) show();
  });
  onUnauthenticated((error) => {
    forgetKey();
    showSignIn();
    showError(error);
  });
  if (!storedKey()) return showSignIn();
  try {
    await enter(await get("/v1/organization"));
  } catch (error) {
    if (storedKey()) {
      showSignIn();
      showError(error);
    }
  }
}

start();
