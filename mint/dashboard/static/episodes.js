// Episodes: an agent's tasks on a deployment, recorded turn by turn token-exact (when the
// deployment's capture records tokens) and rewarded after the fact. The deployment's page lists
// them (`episodesSection`), filtered to rewarded or open ones or to one task; an episode's page
// (`renderEpisode`, `#/episodes/<key>`) shows its turns in order (the messages the harness added
// before each, such as tool results, the assistant's message with its tool calls, the version
// that sampled it and its tokens) and a form that rewards it.

import { get, post } from "./api.js";
import { code, facts, fill, h, heading, link, number, section, table, when } from "./dom.js";
import { apiForm, field, input, numberOf, textOf } from "./forms.js";
import { message } from "./messages.js";
import { showError, showNotice } from "./ui.js";

const EPISODE_PAGE = 50;

export function episodeHref(key) {
  return `#/episodes/${encodeURIComponent(key)}`;
}

function statusBadge(episode) {
  return h("span", { class: `badge badge-episode-${episode.status}` }, episode.status);
}

function rewardText(episode) {
  if (episode.reward === null || episode.reward === undefined) return "—";
  return [number(episode.reward, 3), episode.label ? ` (${episode.label})` : ""].join("");
}

// The versions that sampled an episode, in order of first use.
function versionsText(models) {
  if (!models.length) return "—";
  return models.flatMap((model, index) => (index ? [", ", code(model)] : [code(model)]));
}

function episodesTable(episodes) {
  return table(
    "Episodes, newest first",
    [
      ["Episode", (episode) => link(episodeHref(episode.id), episode.id)],
      ["Task", (episode) => episode.task ?? "—"],
      ["Status", statusBadge],
      ["Reward", rewardText, "num"],
      ["Turns", (episode) => number(episode.steps), "num"],
      ["Sampled by", (episode) => versionsText(episode.models)],
      ["Last turn", (episode) => when(episode.last_turn_at)],
    ],
    episodes,
    {
      empty: "No episodes match.",
      rowAttributes: (episode) => ({ dataset: { episode: episode.id, status: episode.status } }),
    },
  );
}

// The deployment page's episodes: a filter (all, rewarded, open; a task) and the table, a page
// at a time.
export function episodesSection(deployment) {
  const capture = deployment.capture ?? {};
  const recording = capture.tokens && capture.rate > 0;
  const shown = h("select", { id: "episode-filter", name: "episode-filter" }, [
    h("option", { value: "" }, "all episodes"),
    h("option", { value: "true" }, "rewarded"),
    h("option", { value: "false" }, "open (not rewarded yet)"),
  ]);
  const task = input("episode-task", { maxlength: 128, placeholder: "any task" });
  const list = h("div", { id: "episodes" });
  const summary = h("p", { class: "count-line", id: "episode-count", "aria-live": "polite" });
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load more episodes");
  let loaded = [];
  let cursor = null;
  let generation = 0;

  async function load(reset) {
    const mine = reset ? ++generation : generation;
    if (reset) {
      cursor = null;
      loaded = [];
    }
    try {
      const page = await get("/v1/episodes", {
        deployment: deployment.id,
        rewarded: shown.value,
        task: textOf(task),
        limit: EPISODE_PAGE,
        after: cursor,
      });
      if (mine !== generation) return;
      loaded = [...loaded, ...page.data];
      cursor = page.last_id;
      fill(list, episodesTable(loaded));
      more.hidden = !page.has_more;
      const which = { true: "rewarded ", false: "open " }[shown.value] ?? "";
      const count = loaded.length;
      summary.textContent = `Showing ${count} ${which}episode${count === 1 ? "" : "s"}${page.has_more ? " (more to load)" : ""}.`;
    } catch (error) {
      showError(error);
    }
  }

  shown.addEventListener("change", () => load(true));
  task.addEventListener("change", () => load(true));
  more.addEventListener("click", () => load(false));
  load(true);
  return section(
    "Episodes",
    h(
      "p",
      { class: "muted", id: "episodes-state" },
      recording
        ? "Requests marked with X-Mint-Episode are recorded turn by turn, token-exact; reward an episode on its page."
        : "Episodes are recorded when capture records tokens (the Capture form below) and requests carry X-Mint-Episode.",
    ),
    h(
      "div",
      { class: "filters" },
      h("label", { for: "episode-filter" }, "Show"),
      shown,
      h("label", { for: "episode-task" }, "Task"),
      task,
    ),
    summary,
    list,
    more,
  );
}

function mean(values) {
  return values.length ? values.reduce((sum, value) => sum + value, 0) / values.length : null;
}

function turnItem(turn, total) {
  const start = turn.messageNumber;
  const added = turn.added_messages.map((entry, index) => message(entry, start + index));
  const said = turn.message ? message(turn.message, start + added.length) : null;
  const meanLogprob = mean(turn.logprobs);
  return h(
    "li",
    { class: "turn", dataset: { turn: String(turn.index + 1), model: turn.model } },
    h(
      "div",
      { class: "turn-head" },
      h("strong", {}, `Turn ${turn.index + 1} of ${total}`),
      h("span", {}, "sampled by ", code(turn.model), ` (revision ${turn.revision})`),
      h("span", { class: "turn-tokens" }, `${turn.prompt_token_ids.length} prompt / ${turn.token_ids.length} sampled tokens`),
      meanLogprob === null ? null : h("span", {}, `mean logprob ${number(meanLogprob, 3)}`),
      turn.finish_reason ? h("span", {}, `finished: ${turn.finish_reason}`) : null,
      h("span", {}, `${number(turn.latency_ms)} ms`),
      when(turn.created_at),
    ),
    added.length
      ? h(
          "div",
          { class: "turn-added" },
          h(
            "p",
            { class: "muted" },
            turn.index === 0
              ? `The conversation it started from (${added.length} message${added.length === 1 ? "" : "s"}):`
              : `Added by the harness since the last turn (${added.length} message${added.length === 1 ? "" : "s"}):`,
          ),
          h("ol", { class: "messages", "aria-label": `Messages added before turn ${turn.index + 1}` }, added),
        )
      : null,
    said
      ? h("ol", { class: "messages", "aria-label": `Answer of turn ${turn.index + 1}` }, said)
      : h("p", { class: "muted" }, "No assistant message recorded."),
    h(
      "details",
      { class: "turn-token-ids" },
      h("summary", {}, "Token ids and logprobs"),
      h("pre", {}, `prompt: ${JSON.stringify(turn.prompt_token_ids)}`),
      h("pre", {}, `sampled: ${JSON.stringify(turn.token_ids)}`),
      h("pre", {}, `logprobs: ${JSON.stringify(turn.logprobs.map((value) => +value.toFixed(4)))}`),
    ),
  );
}

function turnsList(episode) {
  const turns = episode.turns ?? [];
  if (!turns.length) return h("p", { class: "empty" }, "No turns recorded.");
  let next = 1;
  const numbered = turns.map((turn) => {
    const item = { ...turn, messageNumber: next };
    next += turn.added_messages.length + (turn.message ? 1 : 0);
    return item;
  });
  return h(
    "ol",
    { class: "turns", id: "turns", "aria-label": "Turns, in order" },
    numbered.map((turn) => turnItem(turn, turns.length)),
  );
}

// "1, 0.5, 0" to [1, 0.5, 0]; blank: none. A word that is no number is refused here; a count
// that does not match the turns is the API's to refuse (it knows the turns it recorded).
function turnScoresOf(control) {
  const text = control.value.trim();
  if (!text) return undefined;
  return text.split(/[\s,;]+/).filter(Boolean).map((part) => {
    const value = Number(part);
    if (!Number.isFinite(value)) throw new Error(`Turn scores: ${JSON.stringify(part)} is not a number.`);
    return value;
  });
}

function rewardForm(episode, rebuild) {
  const given = episode.reward !== null && episode.reward !== undefined;
  const score = input("reward-score", {
    type: "number",
    step: "any",
    inputmode: "decimal",
    value: given ? String(episode.reward) : undefined,
  });
  const turnScores = input("reward-turn-scores", {
    value: episode.turn_scores ? episode.turn_scores.join(", ") : undefined,
  });
  const label = input("reward-label", { maxlength: 100, value: episode.label ?? undefined });
  const comment = h("textarea", { id: "reward-comment", name: "reward-comment", rows: 3 }, episode.comment ?? "");
  return apiForm({
    id: "reward-episode",
    title: given ? "Change the reward" : "Reward this episode",
    description: given
      ? "A new reward replaces the one given."
      : "Online RL trains on an episode once it is rewarded. Any key of the organization may reward it.",
    fields: [
      field("Score", score, "Any number; 0 to 1 by convention."),
      field(
        "Turn scores",
        turnScores,
        `Optional: one score per turn, in order, separated by commas (this episode has ${episode.steps} turn${episode.steps === 1 ? "" : "s"}).`,
      ),
      field("Label", label, "Optional, e.g. solved, gave_up."),
      field("Comment", comment),
    ],
    actions: h("button", { type: "submit", id: "reward-submit" }, given ? "Change the reward" : "Reward"),
    action: async () => {
      const rewarded = await post(`/v1/episodes/${encodeURIComponent(episode.id)}/reward`, {
        score: numberOf(score),
        turn_scores: turnScoresOf(turnScores),
        label: textOf(label),
        comment: textOf(comment),
      });
      showNotice(`Episode ${rewarded.id} rewarded ${rewarded.reward}.`);
      await rebuild();
    },
  });
}

function episodeFacts(episode, deployment) {
  return facts([
    ["Key", code(episode.id)],
    [
      "Deployment",
      link(`#/deployments/${encodeURIComponent(episode.deployment_id)}`, deployment?.name ?? episode.deployment_id),
    ],
    ["Task", episode.task ?? "—"],
    ["Status", h("span", { id: "episode-status" }, statusBadge(episode))],
    ["Reward", h("span", { id: "episode-reward" }, rewardText(episode))],
    ["Turn scores", episode.turn_scores ? episode.turn_scores.map((value) => number(value, 3)).join(", ") : "—"],
    ["Comment", episode.comment ?? "—"],
    ["Rewarded by", episode.rewarded_by ? [episode.rewarded_by, " at ", when(episode.rewarded_at)] : "—"],
    ["Turns", number(episode.steps)],
    ["Tokens", `${number(episode.tokens_in)} prompt / ${number(episode.tokens_out)} sampled`],
    ["Latency", `${number(episode.latency_ms)} ms`],
    ["Sampled by", versionsText(episode.models)],
    ["First turn", when(episode.created_at)],
    ["Last turn", when(episode.last_turn_at)],
    ["Kept until", when(episode.expires_at)],
  ]);
}

export async function renderEpisode(key) {
  const container = h("div", {});
  const path = `/v1/episodes/${encodeURIComponent(key)}`;

  async function build() {
    const episode = await get(path);
    let deployment = null;
    try {
      deployment = await get(`/v1/deployments/${encodeURIComponent(episode.deployment_id)}`);
    } catch {
      deployment = null; // the link shows the id instead
    }
    return [
      ...heading(
        `Episode ${episode.id}`,
        "Its turns in order, token-exact, as the deployment served them; and its reward.",
      ),
      episodeFacts(episode, deployment),
      section("Reward", rewardForm(episode, rebuild)),
      section("Turns", turnsList(episode)),
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
