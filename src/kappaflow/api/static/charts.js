// Line charts drawn as SVG through the DOM: a rolling history of a few series.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 320;
const HEIGHT = 110;
const PAD = { left: 44, right: 6, top: 6, bottom: 16 };

function svg(name, attrs = {}, parent = null) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (parent) parent.appendChild(el);
  return el;
}

/** A number in a few characters: 1234567 → "1.23M". */
export function compact(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  for (const [size, unit] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (abs >= size) return `${(value / size).toFixed(abs >= size * 100 ? 0 : 2)}${unit}`;
  }
  return Number.isInteger(value) ? String(value) : value.toFixed(abs >= 100 ? 0 : 1);
}

/** A chart of `series` ([{name}]) over time in `parent`; `push` adds a point to each. */
export class LineChart {
  constructor(parent, title, series, testid) {
    this.series = series;
    this.figure = document.createElement("figure");
    this.figure.className = "chart";
    this.figure.dataset.testid = testid;
    const caption = document.createElement("figcaption");
    caption.textContent = title;
    this.legend = document.createElement("span");
    this.legend.className = "legend";
    caption.appendChild(this.legend);
    this.figure.appendChild(caption);
    this.root = svg("svg", {
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
      role: "img",
      "aria-label": title,
    });
    this.figure.appendChild(this.root);
    parent.appendChild(this.figure);
  }

  /** Redraw from `history`: [{t: epoch ms, v: [one number or null per series]}]. */
  draw(history) {
    this.root.replaceChildren();
    const points = history.filter((p) => p.v.some((x) => x !== null && x !== undefined));
    const values = points.flatMap((p) => p.v.filter((x) => x !== null && x !== undefined));
    let low = Math.min(0, ...values);
    let high = Math.max(1, ...values);
    if (high === low) high = low + 1;
    const t0 = history.length ? history[0].t : 0;
    const t1 = history.length ? history[history.length - 1].t : 1;
    const span = Math.max(t1 - t0, 1);
    const x = (t) => PAD.left + ((t - t0) / span) * (WIDTH - PAD.left - PAD.right);
    const y = (v) => HEIGHT - PAD.bottom - ((v - low) / (high - low)) * (HEIGHT - PAD.top - PAD.bottom);

    const axis = svg("g", { class: "axis" }, this.root);
    svg("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: y(low), y2: y(low) }, axis);
    svg("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: HEIGHT - PAD.bottom }, axis);
    const top = svg("text", { x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, axis);
    top.textContent = compact(high);
    const bottom = svg("text", { x: PAD.left - 4, y: y(low), "text-anchor": "end" }, axis);
    bottom.textContent = compact(low);
    const seconds = Math.round(span / 1000);
    const label = svg("text", { x: WIDTH - PAD.right, y: HEIGHT - 3, "text-anchor": "end" }, axis);
    label.textContent = history.length > 1 ? `last ${seconds} s` : "";

    this.series.forEach((_, i) => {
      const coords = points
        .filter((p) => p.v[i] !== null && p.v[i] !== undefined)
        .map((p) => `${x(p.t).toFixed(1)},${y(p.v[i]).toFixed(1)}`);
      if (coords.length === 1) coords.push(coords[0].replace(/^[^,]+/, String(WIDTH - PAD.right)));
      if (coords.length) svg("polyline", { points: coords.join(" "), class: `line s${i}` }, this.root);
    });

    const last = history.length ? history[history.length - 1].v : [];
    this.legend.replaceChildren(
      ...this.series.map((s, i) => {
        const item = document.createElement("span");
        item.className = `key s${i}`;
        item.dataset.series = s.name;
        item.dataset.value = last[i] === null || last[i] === undefined ? "" : String(last[i]);
        item.textContent = `${s.name} ${compact(last[i])}`;
        return item;
      }),
    );
  }
}
