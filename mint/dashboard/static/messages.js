// A conversation's messages as the dashboard shows them (an eval trajectory's, an episode's
// turns): each message with its role, its text and its tool calls with their arguments.

import { code, h } from "./dom.js";

export function messageText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content))
    return content.map((part) => (typeof part === "string" ? part : (part.text ?? JSON.stringify(part)))).join("");
  return JSON.stringify(content, null, 2);
}

function prettyArguments(text) {
  try {
    return JSON.stringify(typeof text === "string" ? JSON.parse(text) : text, null, 2);
  } catch {
    return String(text);
  }
}

function toolCall(call) {
  const fn = call.function ?? call;
  return h(
    "li",
    { class: "tool-call" },
    h("span", { class: "tool-name" }, "Tool call ", code(fn.name ?? "?"), call.id ? [" (", code(call.id), ")"] : null),
    h("pre", {}, prettyArguments(fn.arguments ?? {})),
  );
}

// One message as a list item; `number` is its place in the conversation (1-based).
export function message(entry, number) {
  const role = entry.role ?? "?";
  const calls = entry.tool_calls ?? [];
  return h(
    "li",
    { class: `message role-${role}` },
    h(
      "div",
      { class: "message-head" },
      h("span", { class: "step" }, `#${number}`),
      h("span", { class: "role" }, role),
      entry.tool_call_id ? h("span", {}, "answering ", code(entry.tool_call_id)) : null,
    ),
    messageText(entry.content) ? h("pre", { class: "content" }, messageText(entry.content)) : null,
    calls.length ? h("ul", { class: "tool-calls", "aria-label": "Tool calls" }, calls.map(toolCall)) : null,
  );
}
