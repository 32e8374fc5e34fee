// The topic browser (topics with their sizes, a peek at a topic's records) and a job's
// dead-letter and late topics with each record's reason, read through the service's
// topic endpoints.

import { ApiError, isMissingEndpoint, request, stream } from "./api.js";
import { compact } from "./charts.js";

const PEEK = 20;
const LETTERS_KEPT = 50;
const LETTERS_POLL_MS = 3000;
const MISSING = "This service has no topic browser (GET /v1/topics).";

function cell(tag, content, className) {
  const el = document.createElement(tag);
  el.textContent = content === null || content === undefined ? "" : String(content);
  if (className) el.className = className;
  return el;
}

function shown(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/** A record's value as an object when it is JSON, else as it came. */
function parsed(value) {
  if (typeof value !== "string") return value;
  try {
    return JSON.parse(value);
  } catch {
    return value;
  }
}

/** An ISO time as its time of day (UTC), the date in a tooltip. */
function timeCell(value) {
  const td = cell("td", value ? value.slice(11, 19) : "");
  if (value) td.title = value;
  return td;
}

function keyOf(value) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    return Object.values(value).map(shown).join(" · ");
  }
  return shown(value);
}

function items(answer) {
  if (Array.isArray(answer)) return answer;
  return (answer && (answer.items || answer.records || answer.topics)) || [];
}

function recordsPath(topic) {
  return `/v1/topics/${encodeURIComponent(topic)}/records?limit=${PEEK}`;
}

/** Newest first, by time then partition and offset where the records say. */
function newestFirst(records) {
  const at = (r) => Date.parse(r.timestamp || "") || 0;
  return [...records].sort((a, b) => at(b) - at(a) || (b.offset ?? 0) - (a.offset ?? 0));
}

function fill(table, headers, rows) {
  const head = document.createElement("tr");
  for (const h of headers) head.appendChild(cell("th", h));
  const thead = document.createElement("thead");
  thead.appendChild(head);
  const body = document.createElement("tbody");
  for (const row of rows) body.appendChild(row);
  table.replaceChildren(thead, body);
}

export class TopicBrowser {
  constructor(root, onMissing) {
    this.table = root.querySelector("[data-testid=topics-table]");
    this.unavailable = root.querySelector("[data-testid=topics-unavailable]");
    this.peekTitle = root.querySelector("[data-testid=peek-topic]");
    this.peekTable = root.querySelector("[data-testid=peek]");
    this.peekEmpty = root.querySelector("[data-testid=peek-empty]");
    this.peekNote = root.querySelector("[data-testid=peek-note]");
    this.chosen = null;
    this.onMissing = onMissing;
  }

  async refresh() {
    let answer;
    try {
      answer = await request("/v1/topics");
    } catch (err) {
      this.unavailable.hidden = false;
      this.unavailable.textContent = isMissingEndpoint(err) ? MISSING : err.message;
      if (isMissingEndpoint(err)) this.onMissing();
      return;
    }
    this.unavailable.hidden = true;
    const topics = items(answer).map((t) => (typeof t === "string" ? { name: t } : t));
    const columns = [...new Set(topics.flatMap((t) => Object.keys(t)))].filter(
      (c) => c !== "name" && c !== "topic" && typeof topics.find((t) => c in t)[c] !== "object",
    );
    const rows = topics.map((t) => {
      const name = t.name ?? t.topic;
      const tr = document.createElement("tr");
      tr.dataset.topic = name;
      tr.className = name === this.chosen ? "chosen pick" : "pick";
      tr.tabIndex = 0;
      const link = cell("td", name);
      tr.appendChild(link);
      for (const c of columns) tr.appendChild(cell("td", typeof t[c] === "number" ? compact(t[c]) : shown(t[c]), "num"));
      const choose = () => this.peek(name);
      tr.addEventListener("click", choose);
      tr.addEventListener("keydown", (e) => e.key === "Enter" && choose());
      return tr;
    });
    fill(this.table, ["topic", ...columns], rows);
    if (this.chosen) await this.peek(this.chosen, false);
  }

  async peek(topic, highlight = true) {
    this.chosen = topic;
    this.peekTitle.textContent = topic;
    if (highlight) {
      for (const tr of this.table.querySelectorAll("tr[data-topic]")) {
        tr.classList.toggle("chosen", tr.dataset.topic === topic);
      }
    }
    try {
      const records = items(await request(recordsPath(topic)));
      const rows = records.map((r) => {
        const tr = document.createElement("tr");
        tr.appendChild(cell("td", r.partition, "num"));
        tr.appendChild(cell("td", r.offset, "num"));
        tr.appendChild(cell("td", r.timestamp || ""));
        tr.appendChild(cell("td", shown(r.key)));
        tr.appendChild(cell("td", shown(parsed(r.value)), "value"));
        return tr;
      });
      fill(this.peekTable, ["partition", "offset", "time", "key", "value"], rows);
      this.peekEmpty.hidden = rows.length > 0;
      this.peekEmpty.textContent = "No records.";
      this.peekNote.textContent = rows.length ? `the first ${rows.length} records` : "";
    } catch (err) {
      this.peekTable.replaceChildren();
      this.peekEmpty.hidden = false;
      this.peekEmpty.textContent = err.message;
    }
  }
}

/** A job's dead letters and late events, newest first, each with its reason: those of
 * the last hour, then each new one as it comes (the topic's follow stream; polled where
 * the service has none). */
export class Letters {
  constructor(root) {
    this.root = root;
    this.job = null;
    this.feeds = [];
  }

  show(job, plan) {
    if (this.job === job) return;
    this.close();
    this.job = job;
    this.root.hidden = false;
    const topics = {
      dlq: (plan && plan.dead_letters) || `${job}.dlq`,
      late: (plan && plan.late) || `${job}.late`,
    };
    for (const [which, topic] of Object.entries(topics)) this.feeds.push(this.follow(which, topic));
  }

  close() {
    for (const stop of this.feeds) stop();
    this.feeds = [];
    this.job = null;
  }

  follow(which, topic) {
    const seen = new Map(); // partition:offset → record
    const table = this.root.querySelector(`[data-testid=${which}]`);
    const empty = this.root.querySelector(`[data-testid=${which}-empty]`);
    this.root.querySelector(`[data-testid=${which}-topic]`).textContent = topic;
    table.replaceChildren();
    empty.hidden = false;
    empty.textContent = "None in the last hour.";
    const add = (records) => {
      for (const r of records) seen.set(`${r.partition}:${r.offset}`, r);
      const kept = newestFirst([...seen.values()]).slice(0, LETTERS_KEPT);
      seen.clear();
      for (const r of kept) seen.set(`${r.partition}:${r.offset}`, r);
      this.render(which, kept, table, empty);
    };
    let timer = null;
    let stopped = false;
    const poll = async () => {
      try {
        add(items(await request(`/v1/topics/${encodeURIComponent(topic)}/records?from=1h&limit=${LETTERS_KEPT}`)));
      } catch (err) {
        empty.hidden = false;
        if (isMissingEndpoint(err)) empty.textContent = MISSING;
        else if (err instanceof ApiError && err.status === 404) empty.textContent = "None yet.";
        else empty.textContent = err.message;
      }
      if (!stopped) timer = setTimeout(poll, LETTERS_POLL_MS);
    };
    const close = stream(
      `/v1/topics/${encodeURIComponent(topic)}/follow?from=1h`,
      { record: (record) => add([record]) },
      () => {
        if (!stopped) poll();
      },
    );
    return () => {
      stopped = true;
      close();
      clearTimeout(timer);
    };
  }

  render(which, records, table, empty) {
    const rows = records.map((r) => {
      const value = parsed(r.value) || {};
      const body = typeof value === "object" ? value : { event: value };
      const tr = document.createElement("tr");
      tr.dataset.testid = `${which}-record`;
      tr.appendChild(timeCell(r.timestamp));
      tr.appendChild(cell("td", body.reason ?? body.error ?? "", "reason"));
      if (which === "dlq") {
        const where = body.source_topic
          ? `${body.source_topic}:${body.source_partition}@${body.source_offset}`
          : "";
        let original = body.value ?? "";
        if (body.value_base64) {
          try {
            original = atob(body.value_base64);
          } catch {
            original = body.value_base64;
          }
        }
        tr.appendChild(cell("td", where));
        tr.appendChild(cell("td", shown(original), "value"));
      } else {
        tr.appendChild(cell("td", body.output ?? ""));
        tr.appendChild(cell("td", keyOf(body.key)));
        tr.appendChild(timeCell(body.window_start ?? body.event_time));
        tr.appendChild(timeCell(body.watermark));
      }
      return tr;
    });
    const headers = which === "dlq"
      ? ["time", "reason", "from", "record"]
      : ["time", "reason", "output", "key", "window", "watermark"];
    fill(table, headers, rows);
    empty.hidden = rows.length > 0;
  }
}
