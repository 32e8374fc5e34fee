// The live results of one output: counts per key per window, provisional and final,
// corrections marked as they happen. Fed by the output's change stream (Server-Sent
// Events: a snapshot, then each change) where the service has it, else by polling the
// latest windows.

import { request, stream } from "./api.js";
import { compact } from "./charts.js";

const POLL_MS = 1500;
const WINDOWS_SHOWN = 6;
const KEYS_SHOWN = 40;
/** How long a changed cell stays highlighted. */
const CHANGED_MS = 3000;
const RECORD_FIELDS = new Set([
  "window_start", "window_end", "values", "previous", "kind", "version", "watermark", "batch",
]);

function text(tag, content, className) {
  const el = document.createElement(tag);
  if (content !== undefined) el.textContent = content;
  if (className) el.className = className;
  return el;
}

function keyText(key) {
  return key.map((part) => (typeof part === "string" ? part : JSON.stringify(part))).join(" · ");
}

function windowLabel(ms, endMs) {
  const start = new Date(ms).toISOString().slice(11, 19);
  const end = endMs ? new Date(endMs).toISOString().slice(11, 19) : "";
  return end ? `${start}–${end}` : start;
}

/** The first number among `values`' fields, and its name. */
function mainValue(values, field) {
  if (field && typeof values[field] === "number") return [field, values[field]];
  for (const [name, v] of Object.entries(values || {})) {
    if (typeof v === "number") return [name, v];
  }
  return [null, null];
}

export class ResultsView {
  constructor(root) {
    this.root = root;
    this.table = root.querySelector("[data-testid=results-table]");
    this.empty = root.querySelector("[data-testid=results-empty]");
    this.feed = root.querySelector("[data-testid=results-feed]");
    this.title = root.querySelector("[data-testid=results-output]");
    this.stop = () => {};
    this.target = null;
  }

  /** Show `output` of `job`; `described` is the output in the job's plan, if known. */
  show(job, output, described) {
    const target = `${job}/${output}`;
    if (this.target === target) return;
    this.stop();
    this.target = target;
    this.job = job;
    this.output = output;
    this.keyColumns = described && described.by ? described.by : null;
    this.windowed = described ? Boolean(described.window) : null;
    this.cells = new Map(); // key text → Map(window start ms → cell)
    this.records = new Map(); // key text → latest record (keyed streams)
    this.field = null;
    this.changed = new Map(); // "key@window start" → when it changed
    clearTimeout(this.unmark);
    this.polledOnce = false;
    this.root.hidden = false;
    this.title.textContent = output;
    this.table.replaceChildren();
    this.empty.hidden = true;
    this.base = `/v1/jobs/${encodeURIComponent(job)}/outputs/${encodeURIComponent(output)}`;
    if (this.windowed === false) this.pollLatest();
    else this.follow();
  }

  hide() {
    this.stop();
    clearTimeout(this.unmark);
    this.target = null;
    this.root.hidden = true;
  }

  setFeed(kind, label) {
    this.feed.dataset.feed = kind;
    this.feed.textContent = label;
  }

  follow() {
    const target = this.target;
    this.setFeed("connecting", "connecting…");
    const close = stream(
      `${this.base}/changes`,
      {
        snapshot: (data) => {
          this.cells = new Map();
          for (const record of data.items || []) this.applyRecord(record, false);
          this.setFeed("push", "live: pushed changes");
          this.render();
        },
        change: (record) => {
          this.applyRecord(record, true);
          this.render();
        },
        reset: () => {
          // The service dropped this subscriber: start again from a snapshot.
          close();
          if (this.target === target) this.follow();
        },
      },
      () => {
        if (this.target === target) this.pollWindows();
      },
    );
    this.stop = close;
  }

  recordKey(record) {
    const columns = this.keyColumns || Object.keys(record).filter((k) => !RECORD_FIELDS.has(k));
    return columns.map((c) => record[c]);
  }

  /** A changelog record into the cells; a higher version than the one held only. */
  applyRecord(record, live) {
    const key = keyText(this.recordKey(record));
    const start = Date.parse(record.window_start);
    const row = this.cells.get(key) || new Map();
    const held = row.get(start);
    if (held && record.version !== undefined && held.version >= record.version) return;
    row.set(start, {
      values: record.values || {},
      previous: record.previous || null,
      kind: record.kind || "provisional",
      version: record.version,
      end: Date.parse(record.window_end),
    });
    this.cells.set(key, row);
    if (live) this.changed.set(`${key}@${start}`, Date.now());
  }

  async pollWindows() {
    const target = this.target;
    let timer = null;
    this.stop = () => clearTimeout(timer);
    this.setFeed("poll", "live: polled");
    const tick = async () => {
      try {
        const answer = await request(`${this.base}/windows/latest?limit=200`);
        if (this.target !== target) return;
        const items = answer.items || [];
        if (!items.length && this.windowed === null) {
          const latest = await request(`${this.base}/latest?limit=1`).catch(() => null);
          if (latest && latest.items && latest.items.length) {
            this.windowed = false;
            this.pollLatest();
            return;
          }
        }
        for (const w of items) this.applyWindow(w);
        this.polledOnce = true;
        this.render();
      } catch (err) {
        if (this.target !== target) return;
        this.setFeed("error", err.message);
      }
      if (this.target === target) timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  /** A window of the serving store into the cells: a change of a final window's values
   * while the page watches is a correction. */
  applyWindow(w) {
    const key = keyText(w.key);
    const start = Date.parse(w.window_start);
    const row = this.cells.get(key) || new Map();
    const held = row.get(start);
    if (held && held.version === w.version) return;
    let kind = w.final ? "final" : "provisional";
    if (held && held.kind !== "provisional" && w.final) kind = "correction";
    row.set(start, {
      values: w.values || {},
      previous: held ? held.values : null,
      kind,
      version: w.version,
      end: Date.parse(w.window_end),
    });
    this.cells.set(key, row);
    if (held || this.polledOnce) this.changed.set(`${key}@${start}`, Date.now());
  }

  render() {
    const now = Date.now();
    const starts = new Set();
    for (const row of this.cells.values()) for (const s of row.keys()) starts.add(s);
    const columns = [...starts].sort((a, b) => a - b).slice(-WINDOWS_SHOWN);
    // The keys with the newest windows first: those are the ones that move.
    const newest = (k) => Math.max(...this.cells.get(k).keys());
    const keys = [...this.cells.keys()]
      .filter((k) => columns.some((s) => this.cells.get(k).has(s)))
      .sort((a, b) => newest(b) - newest(a) || (a < b ? -1 : a > b ? 1 : 0))
      .slice(0, KEYS_SHOWN);
    this.empty.hidden = keys.length > 0;
    if (!keys.length) {
      this.table.replaceChildren();
      return;
    }
    let field = null;
    const head = text("tr");
    head.appendChild(text("th", "key"));
    const ends = new Map();
    for (const row of this.cells.values()) {
      for (const [s, cell] of row) {
        ends.set(s, cell.end);
        if (!field) field = mainValue(cell.values)[0];
      }
    }
    this.field = this.field || field;
    head.firstChild.textContent = this.field ? `${this.field} by key` : "key";
    for (const s of columns) {
      const th = text("th", windowLabel(s, ends.get(s)));
      th.dataset.window = new Date(s).toISOString();
      head.appendChild(th);
    }
    const body = text("tbody");
    for (const key of keys) {
      const tr = text("tr");
      tr.dataset.key = key;
      tr.appendChild(text("th", key));
      for (const s of columns) {
        const cell = this.cells.get(key).get(s);
        const td = text("td");
        td.dataset.testid = "cell";
        td.dataset.key = key;
        td.dataset.window = new Date(s).toISOString();
        if (cell) {
          const value = mainValue(cell.values, this.field)[1];
          td.textContent = compact(value);
          td.dataset.value = String(value);
          td.dataset.kind = cell.kind;
          td.dataset.version = String(cell.version);
          td.className = `cell ${cell.kind}`;
          const before = cell.previous ? mainValue(cell.previous, this.field)[1] : null;
          td.title = `${cell.kind}, version ${cell.version}` +
            (before !== null && before !== value ? `, was ${before}` : "");
          if (now - (this.changed.get(`${key}@${s}`) ?? -Infinity) < CHANGED_MS) {
            td.classList.add("changed");
            td.dataset.changed = "true";
          }
        }
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    const thead = text("thead");
    thead.appendChild(head);
    this.table.replaceChildren(thead, body);
    // Drop the highlight of cells whose change is old by drawing again once it is.
    for (const [cell, at] of this.changed) if (now - at >= CHANGED_MS) this.changed.delete(cell);
    clearTimeout(this.unmark);
    if (this.changed.size) {
      const next = Math.min(...this.changed.values()) + CHANGED_MS - now;
      this.unmark = setTimeout(() => this.render(), Math.max(next, 50));
    }
  }

  /** A keyed stream (no windows): each key's latest record, polled. */
  pollLatest() {
    const target = this.target;
    let timer = null;
    this.stop = () => clearTimeout(timer);
    this.setFeed("poll", "live: polled");
    const tick = async () => {
      try {
        const answer = await request(`${this.base}/latest?limit=100`);
        if (this.target !== target) return;
        this.renderLatest(answer.items || []);
      } catch (err) {
        if (this.target !== target) return;
        this.setFeed("error", err.message);
      }
      if (this.target === target) timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  renderLatest(items) {
    this.empty.hidden = items.length > 0;
    if (!items.length) {
      this.table.replaceChildren();
      return;
    }
    const columns = [...new Set(items.flatMap((r) => Object.keys(r.record || r)))];
    const head = text("tr");
    for (const c of columns) head.appendChild(text("th", c));
    const body = text("tbody");
    for (const item of items) {
      const record = item.record || item;
      const tr = text("tr");
      const seen = JSON.stringify(record);
      const key = JSON.stringify(item.key || columns.map((c) => record[c]).slice(0, 1));
      if (this.records.has(key) && this.records.get(key) !== seen) tr.className = "changed";
      this.records.set(key, seen);
      for (const c of columns) {
        const v = record[c];
        tr.appendChild(text("td", typeof v === "object" && v !== null ? JSON.stringify(v) : String(v ?? "")));
      }
      body.appendChild(tr);
    }
    const thead = text("thead");
    thead.appendChild(head);
    this.table.replaceChildren(thead, body);
  }
}
