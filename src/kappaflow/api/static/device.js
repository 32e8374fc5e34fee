// One device's metric, drawn from the IoT application's topics: each reading's value and
// the range its model expected it in (the `scores` topic: `value`, `expected_low`,
// `expected_high`), with the anomaly alerts raised on it (the `alerts` topic), each with
// what was seen and expected. It reads the records of the last `SINCE_MS` through the
// topic browser's endpoint, page by page, and again every `POLL_MS`.

import { request } from "./api.js";
import { compact } from "./charts.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 900;
const HEIGHT = 260;
const PAD = { left: 52, right: 10, top: 10, bottom: 22 };
/** Readings drawn at most (the newest), and pages of a topic read at most per refresh. */
const POINTS = 600;
const PAGES = 20;
const PAGE = 1000;
const SINCE_MS = 60 * 60 * 1000;
const POLL_MS = 5000;

function svg(name, attrs = {}, parent = null) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (parent) parent.appendChild(el);
  return el;
}

function cell(tag, content, className) {
  const el = document.createElement(tag);
  el.textContent = content === null || content === undefined ? "" : String(content);
  if (className) el.className = className;
  return el;
}

function number(x) {
  return typeof x === "number" && Number.isFinite(x) ? x : null;
}

/** `x` with `digits` significant digits, as Python's format `.{digits}g` writes it. */
export function g(x, digits) {
  if (x === 0) return "0";
  const exponent = Math.floor(Math.log10(Math.abs(Number(x.toPrecision(digits)))));
  if (exponent < -4 || exponent >= digits) {
    const [mantissa, power] = x.toExponential(digits - 1).split("e");
    const trimmed = mantissa.includes(".") ? mantissa.replace(/\.?0+$/, "") : mantissa;
    const sign = power.startsWith("-") ? "-" : "+";
    return `${trimmed}e${sign}${power.replace(/^[+-]/, "").padStart(2, "0")}`;
  }
  return String(Number(x.toPrecision(digits)));
}

/** An alert's explanation in a few words, as kappaflow.iot.alerts.explanation says it. */
export function explanation(alert) {
  // A real-time alert's reading is `seen` (its `value` is the score its rule compared).
  const value = number(alert.seen !== undefined ? alert.seen : alert.value);
  if (value === null) return "";
  let words = `${g(value, 4)} seen`;
  const low = number(alert.expected_low);
  const high = number(alert.expected_high);
  if (low !== null && high !== null) words += `, ${g(low, 4)} to ${g(high, 4)} expected`;
  const notes = alert.model ? [String(alert.model)] : [];
  const likelihood = number(alert.likelihood);
  if (likelihood !== null) {
    const tail = 1 - likelihood;
    notes.push(tail > 0 ? `1 in ${g(1 / tail, 2)}` : "never seen");
  }
  return words + (notes.length ? ` (${notes.join("; ")})` : "");
}

/** The JSON values of `topic`'s records stamped since `since` (epoch ms). */
async function recent(topic, since) {
  const values = [];
  let cursor = null;
  for (let page = 0; page < PAGES; page += 1) {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) query.set("cursor", cursor);
    else query.set("from", new Date(since).toISOString());
    const answer = await request(`/v1/topics/${encodeURIComponent(topic)}/records?${query}`);
    for (const record of answer.items || []) {
      try {
        values.push(JSON.parse(record.value));
      } catch {
        // Not JSON: not a score nor an alert.
      }
    }
    cursor = answer.next;
    if (!cursor) break;
  }
  return values;
}

export class DeviceView {
  constructor(root) {
    this.root = root;
    this.form = root.querySelector("[data-testid=device-form]");
    this.chart = root.querySelector("[data-testid=device-chart]");
    this.table = root.querySelector("[data-testid=device-alerts]");
    this.empty = root.querySelector("[data-testid=device-empty]");
    this.note = root.querySelector("[data-testid=device-note]");
    this.legend = root.querySelector("[data-testid=device-legend]");
    this.wanted = null;
    this.timer = null;
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.show({});
    });
  }

  /** Plot `wanted` ({device, metric, scores, alerts}) now and every POLL_MS. */
  show(wanted) {
    const f = this.form.elements;
    const names = ["device", "metric", "scores", "alerts"];
    for (const name of names) {
      if (wanted[name] !== undefined && wanted[name] !== null) f.namedItem(name).value = wanted[name];
    }
    // What is not given keeps the form's value (the topics' default names).
    this.wanted = Object.fromEntries(names.map((name) => [name, f.namedItem(name).value.trim()]));
    clearTimeout(this.timer);
    const run = async () => {
      const mine = this.wanted;
      try {
        await this.refresh(mine);
      } finally {
        if (this.wanted === mine) this.timer = setTimeout(run, POLL_MS);
      }
    };
    run();
  }

  async refresh({ device, metric, scores, alerts }) {
    const since = Date.now() - SINCE_MS;
    const ours = (r) => r && r.device === device && r.metric === metric;
    let readings;
    let raised = [];
    try {
      readings = (await recent(scores, since)).filter((r) => ours(r) && number(r.value) !== null);
      if (alerts) {
        raised = (await recent(alerts, since)).filter(
          (a) => ours(a) && a.status === "raised" && a.rule === "anomaly",
        );
      }
    } catch (err) {
      this.chart.replaceChildren();
      this.table.replaceChildren();
      this.empty.hidden = false;
      this.empty.textContent = err.message;
      return;
    }
    const at = (r) => Date.parse(r.time || "") || 0;
    readings.sort((a, b) => at(a) - at(b));
    readings = readings.slice(-POINTS);
    raised.sort((a, b) => at(b) - at(a));
    this.note.textContent = `${device} · ${metric}: ${readings.length} readings, ${raised.length} anomaly alerts`;
    this.empty.hidden = readings.length > 0;
    this.empty.textContent = readings.length ? "" : "No scores of this device's metric in the last hour.";
    this.legend.hidden = readings.length === 0;
    this.draw(readings, raised);
    this.list(raised);
  }

  draw(readings, raised) {
    this.chart.replaceChildren();
    if (!readings.length) return;
    const at = (r) => Date.parse(r.time || "") || 0;
    const t0 = at(readings[0]);
    const t1 = Math.max(at(readings[readings.length - 1]), t0 + 1);
    const shown = raised.filter((a) => at(a) >= t0 && at(a) <= t1 && number(a.value) !== null);
    const all = readings.flatMap((r) => [r.value, number(r.expected_low), number(r.expected_high)]);
    const numbers = [...all, ...shown.map((a) => a.value)].filter((x) => x !== null);
    let low = Math.min(...numbers);
    let high = Math.max(...numbers);
    if (high === low) high = low + 1;
    const margin = (high - low) * 0.05;
    low -= margin;
    high += margin;
    const x = (t) => PAD.left + ((t - t0) / (t1 - t0)) * (WIDTH - PAD.left - PAD.right);
    const y = (v) => HEIGHT - PAD.bottom - ((v - low) / (high - low)) * (HEIGHT - PAD.top - PAD.bottom);
    const root = svg("svg", {
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
      role: "img",
      "aria-label": "the metric's values, expected range and alerts",
    });
    const axis = svg("g", { class: "axis" }, root);
    svg("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: HEIGHT - PAD.bottom, y2: HEIGHT - PAD.bottom }, axis);
    svg("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: HEIGHT - PAD.bottom }, axis);
    svg("text", { x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, axis).textContent = compact(high);
    svg("text", { x: PAD.left - 4, y: HEIGHT - PAD.bottom, "text-anchor": "end" }, axis).textContent = compact(low);
    const clock = (t) => new Date(t).toISOString().slice(11, 19);
    svg("text", { x: PAD.left, y: HEIGHT - 6 }, axis).textContent = clock(t0);
    svg("text", { x: WIDTH - PAD.right, y: HEIGHT - 6, "text-anchor": "end" }, axis).textContent = clock(t1);
    // The expected range: one polygon per run of readings that have one.
    let run = [];
    const bands = [];
    for (const r of [...readings, null]) {
      if (r && number(r.expected_low) !== null && number(r.expected_high) !== null) {
        run.push(r);
      } else if (run.length) {
        bands.push(run);
        run = [];
      }
    }
    for (const band of bands) {
      const upper = band.map((r) => `${x(at(r)).toFixed(1)},${y(r.expected_high).toFixed(1)}`);
      const lower = band.reverse().map((r) => `${x(at(r)).toFixed(1)},${y(r.expected_low).toFixed(1)}`);
      svg("polygon", { points: [...upper, ...lower].join(" "), class: "band", "data-testid": "device-band" }, root);
    }
    const line = readings.map((r) => `${x(at(r)).toFixed(1)},${y(r.value).toFixed(1)}`);
    svg("polyline", {
      points: line.join(" "),
      class: "value",
      "data-testid": "device-values",
      "data-count": readings.length,
    }, root);
    for (const a of shown) {
      const mark = svg("circle", {
        cx: x(at(a)).toFixed(1),
        cy: y(a.value).toFixed(1),
        r: 6,
        class: "alert",
        "data-testid": "device-alert-mark",
      }, root);
      svg("title", {}, mark).textContent = `${a.time}: ${explanation(a) || a.reason}`;
    }
    this.chart.appendChild(root);
  }

  list(raised) {
    const head = document.createElement("tr");
    for (const h of ["time", "score", "seen and expected", "reason"]) head.appendChild(cell("th", h));
    const thead = document.createElement("thead");
    thead.appendChild(head);
    const body = document.createElement("tbody");
    for (const a of raised) {
      const tr = document.createElement("tr");
      tr.appendChild(cell("td", (a.time || "").replace("T", " ").slice(0, 19)));
      tr.appendChild(cell("td", number(a.score) === null ? "" : a.score.toFixed(3), "num"));
      tr.appendChild(cell("td", explanation(a)));
      tr.appendChild(cell("td", a.reason || ""));
      body.appendChild(tr);
    }
    this.table.replaceChildren(thead, body);
    this.table.hidden = raised.length === 0;
  }
}
