// Building the page: elements from data with text nodes only (never HTML from the API), and
// the few formats every view shares (times, numbers, percentages, statuses).

export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  setAttributes(element, attributes);
  append(element, children);
  return element;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  setAttributes(element, attributes);
  append(element, children);
  return element;
}

function setAttributes(element, attributes) {
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(element.dataset, value);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

// Replace an element's content; like `h`, it skips null, undefined and false.
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// A table with a caption, column headers and one row per item; `columns` are
// [header, (item) => cell content, "num"?] entries ("num" right-aligns a column of numbers).
// An empty list says so instead of an empty table.
export function table(caption, columns, items, { empty = "Nothing here yet.", rowAttributes } = {}) {
  if (!items.length) return h("p", { class: "empty" }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      h("caption", {}, caption),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          columns.map(([header, , align]) => h("th", { scope: "col", class: align }, header)),
        ),
      ),
      h(
        "tbody",
        {},
        items.map((item) =>
          h(
            "tr",
            rowAttributes ? rowAttributes(item) : {},
            columns.map(([, cell, align]) => h("td", { class: align }, cell(item))),
          ),
        ),
      ),
    ),
  );
}

// A definition list of label/value pairs, for a resource's fields.
export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs
      .filter(([, value]) => value !== undefined)
      .map(([label, value]) => h("div", {}, h("dt", {}, label), h("dd", {}, value ?? "—"))),
  );
}

export function link(href, text) {
  return h("a", { href }, text);
}

export function code(text) {
  return h("code", {}, text);
}

export function section(title, ...children) {
  const id = `section-${title.toLowerCase().replace(/[^a-z0-9]+/g, "-")}`;
  return h("section", { "aria-labelledby": id }, h("h2", { id }, title), ...children);
}

// Times arrive as ISO strings (most resources) or Unix seconds (OpenAI-shaped jobs).
export function when(value) {
  if (value === null || value === undefined) return "—";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return h("time", { datetime: date.toISOString() }, date.toLocaleString());
}

export function number(value, digits = 0) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

// US dollars to the hundredth of a cent: what a small job costs is often less than a cent.
export function money(value) {
  return value === null || value === undefined ? "—" : `$${number(value, 4)}`;
}

export function percent(value, digits = 1) {
  if (value === null || value === undefined) return "—";
  return `${(100 * value).toFixed(digits)}%`;
}

export function signedPoints(value, digits = 1) {
  if (value === null || value === undefined) return "—";
  const points = 100 * value;
  return `${points >= 0 ? "+" : "−"}${Math.abs(points).toFixed(digits)} pts`;
}

export function status(value) {
  return h("span", { class: `status status-${value}` }, value);
}

export function bytes(value) {
  if (value === null || value === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let size = value;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  return `${size.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

// A page heading with an optional line under it.
export function heading(title, subtitle) {
  return [h("h1", {}, title), subtitle ? h("p", { class: "subtitle" }, subtitle) : null];
}
