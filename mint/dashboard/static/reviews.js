// Expert review: the organization's review queues with their progress (`#/reviews`), and a
// queue worked through item by item (`#/reviews/<queue id>`), made for long sessions at the
// keyboard. An item shows its conversation (tool calls and results included) beside the
// reference and the grades (each grader's verdict, a judge's reply), why it is in the queue and
// where it stands in it; the review form takes a verdict, a score, marks per rubric criterion, a
// comment and a correction that starts from the model's own turn. What is typed for an item is
// kept while the person moves between items, until the page is left.

import { all, get, post } from "./api.js";
import { code, fill, h, heading, link, number, section, table, when } from "./dom.js";
import { apiForm, field, input, numberOf, select, textOf } from "./forms.js";
import { message, messageText } from "./messages.js";
import { showError } from "./ui.js";

const ITEM_PAGE = 50;
const MOST_QUEUES = 200;
const SHOWN = [
  ["todo", "left for you"],
  ["all", "all items"],
  ["reviewed", "reviewed (one review or more)"],
  ["done", "done (all the reviews wanted)"],
];
// [keys, what they do]: the page's help, and what `onKey` answers.
const KEYS = [
  ["j or →", "next item"],
  ["k or ←", "previous item"],
  ["p", "verdict: pass"],
  ["f", "verdict: fail"],
  ["1 to 9", "mark a rubric criterion: met, not met, unmarked in turn"],
  ["c", "open the correction editor on the model's turn"],
  ["Enter", "submit the review (Ctrl+Enter inside a text field)"],
  ["Esc", "close the correction editor (the correction is not sent)"],
  ["?", "show or hide these keys"],
];

export function queueHref(queueId) {
  return `#/reviews/${encodeURIComponent(queueId)}`;
}

function plural(count, noun) {
  return `${number(count)} ${noun}${count === 1 ? "" : "s"}`;
}

function sourceLink(queue) {
  if (queue.eval_run_id) return link(`#/evals/${encodeURIComponent(queue.eval_run_id)}`, `eval run ${queue.eval_run_id}`);
  return link(`#/deployments/${encodeURIComponent(queue.deployment_id)}`, `deployment ${queue.deployment_id}`);
}

function progressBar(progress, label) {
  return h("progress", { max: Math.max(progress.items, 1), value: progress.done, "aria-label": label });
}

// ---- the queues -------------------------------------------------------------------------------

export async function renderQueues() {
  const listed = await all("/v1/reviews/queues", {}, MOST_QUEUES);
  // The list leaves progress out (it counts per caller); each queue's own answer has it.
  const queues = await Promise.all(listed.map((queue) => get(`/v1/reviews/queues/${encodeURIComponent(queue.id)}`)));
  return [
    ...heading(
      "Review queues",
      "Experts judge what the model did: open a queue to work through what is left for you, at the keyboard.",
    ),
    table(
      "Review queues, newest first",
      [
        ["Queue", (queue) => link(queueHref(queue.id), queue.name)],
        ["Source", sourceLink],
        ["Progress", (queue) => progressBar(queue.progress, `${queue.name}: items done`)],
        ["Items", (queue) => number(queue.progress.items), "num"],
        ["Reviewed", (queue) => number(queue.progress.reviewed), "num"],
        ["Done", (queue) => number(queue.progress.done), "num"],
        ["Left for you", (queue) => number(queue.progress.todo), "num"],
        ["Reviews per item", (queue) => number(queue.reviews_per_item), "num"],
        ["Created", (queue) => when(queue.created_at)],
      ],
      queues,
      {
        empty:
          "No review queues yet. A developer makes one from an eval run or a deployment's captures: " +
          "`mint reviews create` or POST /v1/reviews/queues.",
        rowAttributes: (queue) => ({ dataset: { queue: queue.id } }),
      },
    ),
  ];
}

// ---- what an item shows -----------------------------------------------------------------------

function shownJson(value) {
  if (value === null || value === undefined) return null;
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

// The model's own (assistant) messages, by index in the conversation: where a correction may start.
function modelTurns(snapshot) {
  return snapshot.messages
    .map((entry, index) => ({ entry, index }))
    .filter(({ entry, index }) => index >= snapshot.prompt_length && entry.role === "assistant");
}

function conversation(snapshot) {
  const items = snapshot.messages.map((entry, index) => {
    const item = message(entry, index + 1);
    item.dataset.index = String(index);
    if (index >= snapshot.prompt_length) item.classList.add("model-part");
    if (index === snapshot.prompt_length)
      return [h("li", { class: "part-mark", "aria-hidden": "true" }, "The model's part"), item];
    return item;
  });
  return h(
    "div",
    { class: "review-conversation" },
    h("h2", { id: "conversation-title" }, "Conversation"),
    h(
      "p",
      { class: "muted" },
      `${plural(snapshot.messages.length, "message")}; the model's part starts at #${snapshot.prompt_length + 1}. `,
      "Model: ",
      code(snapshot.model),
    ),
    h("ol", { class: "messages", id: "item-messages", "aria-labelledby": "conversation-title" }, items),
    snapshot.error ? h("p", { class: "error-text" }, h("strong", {}, "Error: "), snapshot.error) : null,
  );
}

// A grader's recorded grade: the whole grade, or a composite part's (`<index>:<type>`).
function gradeOf(snapshot, view) {
  if (view.name === "overall") return snapshot.grade ?? {};
  const index = Number(view.name.split(":")[0]);
  return snapshot.grade?.parts?.[index]?.grade ?? {};
}

function verdictBadge(passed) {
  if (passed === null || passed === undefined) return h("span", { class: "badge" }, "no verdict");
  return h("span", { class: `badge badge-${passed ? "passed" : "failed"}` }, passed ? "pass" : "fail");
}

function graderEntry(snapshot, view) {
  const grade = gradeOf(snapshot, view);
  const judge = grade.judge;
  return h(
    "li",
    { class: "grader", dataset: { grader: view.name } },
    h(
      "div",
      { class: "grader-head" },
      h("strong", {}, view.name),
      verdictBadge(view.passed),
      h("span", {}, `score ${number(view.score, 2)}`),
      view.model ? h("span", {}, "judge ", code(view.model)) : null,
      view.pass_threshold !== undefined ? h("span", {}, `passes from ${number(view.pass_threshold, 2)}`) : null,
      view.no_verdict ? h("span", { class: "badge level-warning" }, "gave no verdict") : null,
    ),
    grade.detail ? h("p", { class: "grader-detail" }, grade.detail) : null,
    judge
      ? h(
          "div",
          { class: "judge-reply" },
          h("p", { class: "muted" }, "The judge's reply:"),
          h("pre", {}, judge.reply || "(empty)"),
          h("details", {}, h("summary", {}, "The judge's prompt"), h("pre", {}, judge.prompt ?? "")),
        )
      : null,
  );
}

function grades(snapshot) {
  if (!snapshot.graders.length) {
    if (snapshot.kind === "capture") return h("p", { class: "muted" }, "A captured answer has no grade.");
    return h("p", { class: "muted" }, "No grade recorded.");
  }
  return h("ul", { class: "graders", id: "item-grades", "aria-label": "Graders" }, snapshot.graders.map((view) => graderEntry(snapshot, view)));
}

function feedbackList(snapshot) {
  if (!snapshot.feedback.length) return null;
  return h(
    "div",
    {},
    h("h3", {}, "Feedback"),
    h(
      "ul",
      { class: "plain-list" },
      snapshot.feedback.map((entry) =>
        h("li", {}, [entry.label, entry.score !== undefined && entry.score !== null ? `score ${entry.score}` : null, entry.comment]
          .filter(Boolean)
          .join(" · ")),
      ),
    ),
  );
}

function reviewLine(review) {
  return h(
    "li",
    { dataset: { reviewer: review.reviewer } },
    h("strong", {}, review.reviewer_name),
    " ",
    verdictBadge(review.passed),
    review.score !== null && review.score !== undefined ? ` score ${number(review.score, 2)}` : "",
    review.correction ? ` · corrected from #${review.correction.from_message + 1}` : "",
    review.comment ? ` · ${review.comment}` : "",
  );
}

// Beside the conversation: the reference, the grades, the review form, and the reviews given.
function beside(snapshot, item, form) {
  const reference = shownJson(snapshot.reference);
  return h(
    "div",
    { class: "review-beside" },
    h("h2", {}, "Reference and grades"),
    h("h3", {}, "Reference"),
    reference === null ? h("p", { class: "muted" }, "None.") : h("pre", { class: "reference", id: "item-reference" }, reference),
    snapshot.solution
      ? h(
          "details",
          {},
          h("summary", {}, "Reference solution"),
          h("ol", { class: "messages" }, snapshot.solution.map((entry, index) => message(entry, index + 1))),
        )
      : null,
    h("h3", {}, "Grades"),
    grades(snapshot),
    feedbackList(snapshot),
    form,
    h("h3", {}, "Reviews given"),
    item.reviews.length
      ? h("ul", { class: "plain-list", id: "item-reviews" }, item.reviews.map(reviewLine))
      : h("p", { class: "muted", id: "item-reviews" }, "None yet."),
  );
}

// ---- the review form --------------------------------------------------------------------------

const RUBRIC_MARKS = [
  ["", "unmarked"],
  ["met", "met"],
  ["not_met", "not met"],
];

function newDraft(snapshot) {
  const turns = modelTurns(snapshot);
  const first = turns[0];
  return {
    passed: null,
    score: "",
    comment: "",
    rubric: Object.fromEntries(snapshot.rubric.map((criterion) => [criterion, ""])),
    editing: false,
    from: first ? first.index : null,
    text: first ? messageText(first.entry.content) : "",
    sent: null,
  };
}

function reviewBody(snapshot, draft) {
  const score = draft.score.trim() === "" ? undefined : Number(draft.score);
  if (draft.passed === null && score === undefined)
    throw new Error("Give a verdict first: press p (pass) or f (fail), or type a score.");
  const rubric = {};
  for (const [criterion, mark] of Object.entries(draft.rubric)) {
    if (mark) rubric[criterion] = { passed: mark === "met" };
  }
  const body = { passed: draft.passed ?? undefined, score, rubric, comment: draft.comment.trim() || undefined };
  if (draft.editing) {
    if (draft.from === null) throw new Error("This item has no turn of the model to correct: close the editor (Esc).");
    if (!draft.text.trim()) throw new Error("Write the corrected turn, or close the editor (Esc) to send no correction.");
    body.correction = { from_message: draft.from, messages: [{ role: "assistant", content: draft.text }] };
  }
  return body;
}

function reviewForm(item, draft, { onSubmit, onEditor }) {
  const snapshot = item.snapshot;
  const verdicts = ["pass", "fail"].map((value) => {
    const radio = h("input", {
      type: "radio",
      name: "review-verdict",
      id: `verdict-${value}`,
      value,
      checked: draft.passed === (value === "pass") || undefined,
    });
    radio.addEventListener("change", () => {
      draft.passed = value === "pass";
    });
    return h("span", { class: "choice" }, radio, h("label", { for: `verdict-${value}` }, `${value === "pass" ? "Pass" : "Fail"} (${value[0]})`));
  });
  const score = input("review-score", { type: "number", min: 0, max: 1, step: "any", inputmode: "decimal", value: draft.score || undefined });
  score.addEventListener("input", () => {
    draft.score = score.value;
  });
  const rubric = snapshot.rubric.map((criterion, index) => {
    const control = select(`rubric-${index}`, RUBRIC_MARKS, { dataset: { criterion } });
    control.value = draft.rubric[criterion] ?? "";
    control.addEventListener("change", () => {
      draft.rubric[criterion] = control.value;
    });
    return field(index < 9 ? `${index + 1}. ${criterion}` : criterion, control);
  });
  const comment = h("textarea", { id: "review-comment", name: "review-comment", rows: 2 }, draft.comment);
  comment.addEventListener("input", () => {
    draft.comment = comment.value;
  });

  const turns = modelTurns(snapshot);
  const from = select(
    "correction-from",
    turns.map(({ entry, index }) => [String(index), `#${index + 1}: ${messageText(entry.content).slice(0, 60) || "(tool calls only)"}`]),
  );
  if (draft.from !== null) from.value = String(draft.from);
  const text = h("textarea", { id: "correction-text", name: "correction-text", rows: 6 }, draft.text);
  text.addEventListener("input", () => {
    draft.text = text.value;
  });
  from.addEventListener("change", () => {
    // The turn chosen is where the rewrite starts: its own text is the start of the rewrite.
    draft.from = Number(from.value);
    draft.text = messageText(snapshot.messages[draft.from].content);
    text.value = draft.text;
  });
  const editor = h(
    "fieldset",
    { class: "correction-editor", id: "correction-editor", hidden: !draft.editing || undefined },
    h("legend", {}, "Correction"),
    turns.length
      ? [
          field("Where it went wrong", from, "The model's message to rewrite; it and every message after it are replaced by the rewrite."),
          field("Rewritten turn", text, "Starts as the model's own text: edit it into what it should have said. Ctrl+Enter submits; Esc closes."),
          h("button", { type: "button", class: "secondary small", onclick: () => onEditor(false) }, "Drop the correction (Esc)"),
        ]
      : h("p", { class: "muted" }, "The model wrote no message here to correct."),
  );
  const opener = h(
    "button",
    { type: "button", class: "secondary", id: "correction-open", hidden: draft.editing || undefined, onclick: () => onEditor(true) },
    "Correct the model's turn (c)",
  );

  const form = apiForm({
    id: "review-form",
    title: draft.sent ? "Your review (sending again replaces it)" : "Your review",
    fields: [
      h("fieldset", { class: "verdict-choice" }, h("legend", {}, "Verdict"), verdicts),
      field("Score", score, "Optional, 0 to 1."),
      rubric.length ? h("fieldset", { class: "rubric-marks" }, h("legend", {}, "Rubric"), rubric) : null,
      field("Comment", comment),
      opener,
      editor,
    ],
    actions: h("button", { type: "submit", id: "review-submit" }, "Submit review (Enter)"),
    action: async () => onSubmit(reviewBody(snapshot, draft)),
  });
  form.editor = { editor, opener, text };
  return form;
}

// ---- a queue, item by item --------------------------------------------------------------------

function typingIn(target) {
  if (!(target instanceof HTMLElement)) return false;
  if (target.isContentEditable) return true;
  if (target.tagName === "INPUT") return !["radio", "checkbox", "button", "submit"].includes(target.type);
  return ["TEXTAREA", "SELECT"].includes(target.tagName);
}

export async function renderQueue(queueId, { signal }) {
  const path = `/v1/reviews/queues/${encodeURIComponent(queueId)}`;
  const state = {
    queue: await get(path),
    status: "todo",
    items: [],
    cursor: null,
    hasMore: false,
    index: 0,
    drafts: new Map(),
    generation: 0,
  };
  const progressLine = h("p", { id: "queue-progress", "aria-live": "polite" });
  const shown = select("review-shown", SHOWN);
  const help = h(
    "dl",
    { class: "keys", id: "review-keys", hidden: true },
    KEYS.map(([keys, does]) => h("div", {}, h("dt", {}, h("kbd", {}, keys)), h("dd", {}, does))),
  );
  const helpLine = h(
    "p",
    { class: "muted keys-line", id: "review-help" },
    "Keys: j/k next/previous, p pass, f fail, c correct, Enter submit, Esc close the editor; press ? for all keys. ",
    "Shortcuts wait while you type in a field.",
  );
  const said = h("p", { class: "muted", id: "review-said", "aria-live": "polite" });
  const itemArea = h("div", { id: "review-item", tabindex: "-1" });
  let form = null;

  function showProgress() {
    const progress = state.queue.progress;
    fill(
      progressLine,
      progressBar(progress, "Items done"),
      ` ${number(progress.reviewed)} of ${plural(progress.items, "item")} reviewed, ${number(progress.done)} done; `,
      `you reviewed ${number(progress.mine)}, `,
      h("strong", { id: "queue-todo" }, `${number(progress.todo)} left for you`),
      ".",
    );
  }

  async function refreshProgress() {
    state.queue = await get(path);
    if (!signal.aborted) showProgress();
  }

  async function loadMore() {
    const mine = state.generation;
    const page = await get(`${path}/items`, { status: state.status, after: state.cursor, limit: ITEM_PAGE });
    if (mine !== state.generation) return false;
    state.items.push(...page.data);
    state.cursor = page.last_id ?? state.cursor;
    state.hasMore = page.has_more;
    return page.data.length > 0;
  }

  function draftOf(item) {
    if (!state.drafts.has(item.id)) state.drafts.set(item.id, newDraft(item.snapshot));
    return state.drafts.get(item.id);
  }

  function showItem({ focus = true } = {}) {
    form = null;
    if (!state.items.length) {
      fill(
        itemArea,
        h(
          "p",
          { class: "empty", id: "item-position" },
          state.status === "todo" ? "Nothing is left for you in this queue." : "No items match.",
        ),
      );
      return;
    }
    const item = state.items[state.index];
    const snapshot = item.snapshot;
    const draft = draftOf(item);
    const more = state.hasMore ? " (more to load)" : "";
    form = reviewForm(item, draft, {
      onSubmit: (body) => submit(item, draft, body),
      onEditor: (open) => setEditor(open),
    });
    fill(
      itemArea,
      h(
        "div",
        { class: "item-head" },
        h(
          "p",
          { id: "item-position", dataset: { item: item.id, task: snapshot.task_id } },
          h("strong", {}, `Item ${state.index + 1} of ${state.items.length}${more}`),
          ` · #${item.position + 1} of ${state.queue.item_count} in the queue · task `,
          code(snapshot.task_id),
          snapshot.split ? ` (split ${snapshot.split})` : "",
          " · graded ",
          verdictBadge(snapshot.passed),
          draft.sent ? [" · you said ", verdictBadge(draft.sent.passed)] : null,
        ),
        h(
          "div",
          { class: "item-reasons" },
          h("span", { class: "muted" }, "In the queue because: "),
          h("ul", { id: "item-reasons", class: "inline-list" }, item.reasons.length ? item.reasons.map((reason) => h("li", {}, reason)) : h("li", {}, "chosen by the queue's filters")),
        ),
      ),
      h("div", { class: "review-grid" }, conversation(snapshot), beside(snapshot, item, form)),
    );
    if (focus && !itemArea.contains(document.activeElement)) itemArea.focus({ preventScroll: true });
  }

  function setEditor(open) {
    if (!form) return;
    const item = state.items[state.index];
    const draft = draftOf(item);
    draft.editing = open;
    const { editor, opener, text } = form.editor;
    editor.hidden = !open;
    opener.hidden = open;
    if (open) {
      text.focus();
      text.setSelectionRange(text.value.length, text.value.length);
    } else {
      itemArea.focus({ preventScroll: true });
    }
  }

  async function move(step) {
    const target = state.index + step;
    if (target < 0) {
      said.textContent = "This is the first item.";
      return;
    }
    if (target >= state.items.length && !(state.hasMore && (await loadMore()))) {
      said.textContent = "That is the last item shown.";
      return;
    }
    state.index = target;
    said.textContent = "";
    showItem();
    window.scrollTo({ top: 0 });
  }

  async function submit(item, draft, body) {
    const review = await post(`/v1/reviews/items/${encodeURIComponent(item.id)}/reviews`, body);
    draft.sent = review;
    item.reviews = [...item.reviews.filter((given) => given.reviewer !== review.reviewer), review];
    const verdict = review.passed === null ? `score ${review.score}` : review.passed ? "pass" : "fail";
    const saved = `Review of ${item.snapshot.task_id} saved: ${verdict}${review.correction ? ", with a correction" : ""}.`;
    await refreshProgress();
    const next = state.index + 1 < state.items.length || (state.hasMore && (await loadMore()));
    if (next) state.index += 1;
    showItem();
    window.scrollTo({ top: 0 });
    said.textContent = next ? saved : `${saved} That was the last item shown; show all items to go back over them.`;
  }

  function verdict(passed) {
    const radio = itemArea.querySelector(`#verdict-${passed ? "pass" : "fail"}`);
    if (!radio) return;
    radio.checked = true;
    radio.dispatchEvent(new Event("change"));
  }

  // A rubric criterion's mark in turn: unmarked, met, not met.
  function mark(number) {
    const control = itemArea.querySelector(`#rubric-${number - 1}`);
    if (!control) return;
    const values = RUBRIC_MARKS.map(([value]) => value);
    control.value = values[(values.indexOf(control.value) + 1) % values.length];
    control.dispatchEvent(new Event("change"));
  }

  function onKey(event) {
    if (event.defaultPrevented || event.isComposing || document.querySelector("dialog[open]")) return;
    const target = event.target;
    const typing = typingIn(target);
    if (event.key === "?" && !typing) {
      event.preventDefault();
      help.hidden = !help.hidden;
      return;
    }
    if (!form || !document.body.contains(form)) return;
    if (event.key === "Escape") {
      if (!form.editor.editor.hidden) {
        event.preventDefault();
        setEditor(false);
      }
      return;
    }
    if (event.key === "Enter") {
      if (event.ctrlKey || event.metaKey) {
        event.preventDefault();
        form.requestSubmit();
        return;
      }
      // In a field Enter types (a text area) or submits by itself (an input); a button or a link does its own thing.
      if (typing || event.shiftKey || event.altKey || target.closest?.("button, a, summary")) return;
      event.preventDefault();
      form.requestSubmit();
      return;
    }
    if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
    const radio = target instanceof HTMLInputElement && target.type === "radio";
    const action = {
      j: () => move(1),
      k: () => move(-1),
      ArrowRight: radio ? null : () => move(1),
      ArrowLeft: radio ? null : () => move(-1),
      p: () => verdict(true),
      f: () => verdict(false),
      c: () => setEditor(true),
    }[event.key];
    if (action) {
      event.preventDefault();
      action();
    } else if (/^[1-9]$/.test(event.key)) {
      event.preventDefault();
      mark(Number(event.key));
    }
  }

  async function reload() {
    state.generation += 1;
    state.items = [];
    state.cursor = null;
    state.index = 0;
    try {
      await loadMore();
      showItem();
    } catch (error) {
      showError(error);
    }
  }

  shown.addEventListener("change", () => {
    state.status = shown.value;
    reload();
  });
  document.addEventListener("keydown", onKey, { signal });
  showProgress();
  await loadMore();
  showItem({ focus: false });
  const queue = state.queue;
  return [
    ...heading(`Review queue ${queue.name}`, [`Items of `, sourceLink(queue), `, ${plural(queue.reviews_per_item, "review")} wanted per item.`]),
    h("p", {}, link("#/reviews", "All review queues")),
    queue.instructions ? section("Instructions", h("p", { class: "instructions" }, queue.instructions)) : null,
    progressLine,
    h("div", { class: "filters" }, h("label", { for: "review-shown" }, "Show"), shown),
    helpLine,
    help,
    said,
    itemArea,
  ];
}
