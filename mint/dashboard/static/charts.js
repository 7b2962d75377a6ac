// Charts drawn as inline SVG: a line chart (loss curves) and a grouped bar chart (before/after
// scores per task). Each has a title and a description for screen readers; the numbers they
// draw are also in a table next to them.

import { h, s } from "./dom.js";

const WIDTH = 720;
const MARGIN = { top: 16, right: 20, bottom: 44, left: 60 };
// Circles mark each point while they stay readable; longer curves draw the line alone.
const MAX_MARKED_POINTS = 300;

// The before/after chart's task names: a bold 12px character is at most about this wide.
const BOLD_CHAR_WIDTH = 7.6;
const LABEL_GAP = 8;
const MAX_TASK_CHARS = 32;
const MAX_LABEL_WIDTH = 280;

let chartCount = 0;

// About `count` round ticks from `low` to `high`; `integer` ticks are whole numbers (steps).
function niceTicks(low, high, count = 5, { integer = false } = {}) {
  if (!(high > low)) return [low];
  const raw = (high - low) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((candidate) => candidate >= raw);
  if (integer && !Number.isInteger(step)) step = step < 1 ? 1 : Math.ceil(step);
  const ticks = [];
  for (let tick = Math.ceil(low / step) * step; tick <= high + step * 1e-9; tick += step) ticks.push(+tick.toFixed(10));
  return ticks;
}

function formatTick(value) {
  if (value === 0) return "0";
  const size = Math.abs(value);
  if (size >= 1000 || size < 0.01) return value.toExponential(1);
  return String(+value.toPrecision(3));
}

function frame(title, description, height) {
  chartCount += 1;
  const titleId = `chart-title-${chartCount}`;
  const descriptionId = `chart-desc-${chartCount}`;
  return s(
    "svg",
    {
      viewBox: `0 0 ${WIDTH} ${height}`,
      class: "chart",
      role: "img",
      "aria-labelledby": `${titleId} ${descriptionId}`,
    },
    s("title", { id: titleId }, title),
    s("desc", { id: descriptionId }, description),
  );
}

function axes(svg, { x0, x1, y0, y1, xTicks, yTicks, xScale, yScale, xLabel, yLabel, xFormat = formatTick }) {
  const group = s("g", { class: "axes" });
  group.append(s("line", { x1: x0, y1: y0, x2: x1, y2: y0, class: "axis" }));
  group.append(s("line", { x1: x0, y1: y0, x2: x0, y2: y1, class: "axis" }));
  for (const tick of yTicks) {
    const y = yScale(tick);
    group.append(s("line", { x1: x0, y1: y, x2: x1, y2: y, class: "grid" }));
    group.append(s("text", { x: x0 - 8, y: y + 4, class: "tick", "text-anchor": "end" }, formatTick(tick)));
  }
  for (const tick of xTicks) {
    const x = xScale(tick);
    group.append(s("text", { x, y: y0 + 18, class: "tick x-tick", "text-anchor": "middle" }, xFormat(tick)));
  }
  group.append(s("text", { x: (x0 + x1) / 2, y: y0 + 38, class: "label", "text-anchor": "middle" }, xLabel));
  group.append(
    s(
      "text",
      {
        x: 14,
        y: (y0 + y1) / 2,
        class: "label",
        "text-anchor": "middle",
        transform: `rotate(-90 14 ${(y0 + y1) / 2})`,
      },
      yLabel,
    ),
  );
  svg.append(group);
}

// `points` are [x, y] pairs sorted by x.
export function lineChart({ title, xLabel, yLabel, points, height = 280 }) {
  const description = points.length
    ? `${points.length} points; ${yLabel} from ${formatTick(points[0][1])} at ${xLabel} ${points[0][0]} to ` +
      `${formatTick(points.at(-1)[1])} at ${xLabel} ${points.at(-1)[0]}.`
    : "No points yet.";
  const svg = frame(title, description, height);
  svg.dataset.points = String(points.length);
  const x0 = MARGIN.left;
  const x1 = WIDTH - MARGIN.right;
  const y0 = height - MARGIN.bottom;
  const y1 = MARGIN.top;
  const xs = points.map(([x]) => x);
  const ys = points.map(([, y]) => y);
  const xLow = points.length ? Math.min(...xs) : 0;
  const xHigh = points.length ? Math.max(...xs) : 1;
  let yLow = points.length ? Math.min(0, ...ys) : 0;
  let yHigh = points.length ? Math.max(...ys) : 1;
  if (yHigh === yLow) {
    yHigh += 1;
    yLow -= yLow === 0 ? 0 : 1;
  }
  const xScale = (x) => (xHigh === xLow ? (x0 + x1) / 2 : x0 + ((x - xLow) / (xHigh - xLow)) * (x1 - x0));
  const yScale = (y) => y0 - ((y - yLow) / (yHigh - yLow)) * (y0 - y1);
  // Steps are whole numbers: so are the x axis's ticks, however few steps there are.
  const xTicks = niceTicks(xLow, xHigh, 8, { integer: xs.every(Number.isInteger) });
  axes(svg, { x0, x1, y0, y1, xTicks, yTicks: niceTicks(yLow, yHigh), xScale, yScale, xLabel, yLabel });
  if (!points.length) {
    svg.append(
      s("text", { x: (x0 + x1) / 2, y: (y0 + y1) / 2, class: "no-data", "text-anchor": "middle" }, "No points yet"),
    );
    return svg;
  }
  const path = points.map(([x, y]) => `${xScale(x).toFixed(1)},${yScale(y).toFixed(1)}`).join(" ");
  svg.append(s("polyline", { points: path, class: "series" }));
  if (points.length <= MAX_MARKED_POINTS) {
    const marks = s("g", { class: "points" });
    for (const [x, y] of points) {
      marks.append(
        s(
          "circle",
          { cx: xScale(x).toFixed(1), cy: yScale(y).toFixed(1), r: 3, class: "point" },
          s("title", {}, `${xLabel} ${x}: ${yLabel} ${formatTick(y)}`),
        ),
      );
    }
    svg.append(marks);
  }
  return svg;
}

// Two bars per category (before and after), values in [0, 1]; `outcome` of each category
// (fixed, broken, still passing, still failing) colours its label.
export function beforeAfterChart({ title, categories, beforeLabel, afterLabel }) {
  const rowHeight = 34;
  // Room below the rows for the ticks, the axis label and a legend line per run.
  const height = MARGIN.top + categories.length * rowHeight + 74;
  const description =
    `${categories.length} tasks; score before (${beforeLabel}) and after (${afterLabel}) for each. ` +
    categories.map((item) => `${item.name}: ${item.before ?? "none"} to ${item.after ?? "none"}`).join("; ");
  const svg = frame(title, description, height);
  svg.dataset.tasks = String(categories.length);
  // The task names sit left of the bars, right-aligned: the column is as wide as the longest
  // (shortened past MAX_TASK_CHARS), measured at the width of a bold character, so that the
  // bold names (fixed, broken) are not cut at the chart's left edge.
  const names = categories.map((item) =>
    item.name.length > MAX_TASK_CHARS ? `${item.name.slice(0, MAX_TASK_CHARS - 1)}…` : item.name,
  );
  const longest = Math.max(4, ...names.map((name) => name.length));
  const labelWidth = Math.min(MAX_LABEL_WIDTH, Math.ceil(longest * BOLD_CHAR_WIDTH) + 2 * LABEL_GAP);
  const x0 = labelWidth;
  const x1 = WIDTH - MARGIN.right;
  const scale = (value) => x0 + value * (x1 - x0);
  const bottom = MARGIN.top + categories.length * rowHeight;
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    svg.append(s("line", { x1: scale(tick), y1: MARGIN.top, x2: scale(tick), y2: bottom, class: "grid" }));
    svg.append(s("text", { x: scale(tick), y: bottom + 16, class: "tick", "text-anchor": "middle" }, String(tick)));
  }
  svg.append(s("text", { x: (x0 + x1) / 2, y: bottom + 34, class: "label", "text-anchor": "middle" }, "score"));
  categories.forEach((item, index) => {
    const top = MARGIN.top + index * rowHeight;
    const group = s("g", { class: `task outcome-${item.outcome}`, "data-task": item.name });
    group.append(
      s(
        "text",
        { x: x0 - LABEL_GAP, y: top + rowHeight / 2 + 4, class: "task-name", "text-anchor": "end" },
        names[index],
        s("title", {}, `${item.name} (${item.outcome})`),
      ),
    );
    const bars = [
      ["before", item.before, top + 5],
      ["after", item.after, top + 17],
    ];
    for (const [which, value, y] of bars) {
      const width = value === null || value === undefined ? 0 : Math.max(1.5, scale(value) - x0);
      group.append(
        s(
          "rect",
          { x: x0, y, width: width.toFixed(1), height: 11, class: `bar bar-${which}` },
          s("title", {}, `${item.name} ${which}: ${value ?? "no trajectory"}`),
        ),
      );
    }
    svg.append(group);
  });
  // One legend line per run, each starting at the left edge: a long model name has the width.
  const legendY = height - 26;
  svg.append(s("rect", { x: LABEL_GAP, y: legendY - 9, width: 12, height: 10, class: "bar bar-before" }));
  svg.append(s("text", { x: LABEL_GAP + 18, y: legendY, class: "tick" }, `before: ${beforeLabel}`));
  svg.append(s("rect", { x: LABEL_GAP, y: legendY + 9, width: 12, height: 10, class: "bar bar-after" }));
  svg.append(s("text", { x: LABEL_GAP + 18, y: legendY + 18, class: "tick" }, `after: ${afterLabel}`));
  return svg;
}

// A legend-free horizontal bar per item, for small breakdowns (usage by kind).
export function barList(items, format) {
  const largest = Math.max(1, ...items.map((item) => item.value));
  return h(
    "ul",
    { class: "bar-list" },
    items.map((item) =>
      h(
        "li",
        {},
        h("span", { class: "bar-label" }, item.label),
        h("meter", { min: 0, max: largest, value: item.value, "aria-label": item.label }),
        h("span", { class: "bar-value" }, format(item.value)),
      ),
    ),
  );
}
