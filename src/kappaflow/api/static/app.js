// The dashboard: services, jobs, the chosen job's progress and accounting as live charts,
// its results, dead letters and late events, and the topics. It polls the service's JSON
// endpoints and follows its event streams; nothing needs a reload.

import { request, session, signIn, signOut } from "./api.js";
import { LineChart, compact } from "./charts.js";
import { DeviceView } from "./device.js";
import { ResultsView } from "./results.js";
import { ShadowView } from "./shadow.js";
import { Letters, TopicBrowser } from "./topics.js";

const POLL_MS = 1500;
const TOPICS_POLL_MS = 5000;
/** Points kept per output: ten minutes at one poll per 1.5 s. */
const HISTORY = 400;

const $ = (id) => document.querySelector(`[data-testid=${id}]`);

function text(tag, content, className) {
  const el = document.createElement(tag);
  el.textContent = content === null || content === undefined ? "" : String(content);
  if (className) el.className = className;
  return el;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function watermark(value) {
  if (!value) return "–";
  const ms = Date.parse(value);
  if (!ms) return "–";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

/** The columns of the outputs table: field, how it is shown, its chart series name. */
const FIELDS = [
  ["events_read", compact],
  ["events", compact],
  ["duplicates", compact],
  ["late", compact],
  ["dead_letters", compact],
  ["input_rows_per_s", compact],
  ["processed_rows_per_s", compact],
  ["lag_records", compact],
  ["event_time_watermark", watermark],
  ["batch_duration_ms", compact],
  ["state_rows", compact],
  ["state_memory_bytes", bytes],
];

const CHARTS = [
  ["Accounting", "chart-accounting", [
    ["read", "events_read"], ["counted", "events"], ["duplicates", "duplicates"],
    ["late", "late"], ["dead letters", "dead_letters"],
  ]],
  ["Rows per second", "chart-rates", [
    ["input", "input_rows_per_s"], ["processed", "processed_rows_per_s"],
  ]],
  ["Lag (offsets behind)", "chart-lag", [["lag", "lag_records"]]],
  ["Batch duration (ms)", "chart-batch", [["batch", "batch_duration_ms"]]],
  ["State", "chart-state", [["rows", "state_rows"]]],
];

class Dashboard {
  constructor() {
    const wanted = new URLSearchParams(location.hash.slice(1));
    this.job = wanted.get("job");
    this.output = wanted.get("output");
    this.history = new Map(); // "job/output" → [{t, row}]
    this.results = new ResultsView($("results"));
    this.letters = new Letters($("letters"));
    this.shadow = new ShadowView($("shadow"));
    this.topics = new TopicBrowser($("topics"), () => {});
    this.device = new DeviceView($("device"));
    this.charts = CHARTS.map(([title, testid, series]) =>
      [new LineChart($("charts"), title, series.map(([name]) => ({ name })), testid), series]);
    this.plan = null;
  }

  start() {
    this.setUpSignIn();
    // A device's metric to plot, as a link gives it: #device=D&metric=M[&scores=T&alerts=T].
    const wanted = new URLSearchParams(location.hash.slice(1));
    if (wanted.get("device") && wanted.get("metric")) {
      this.device.show(Object.fromEntries(wanted.entries()));
    }
    this.loop(() => this.poll(), POLL_MS);
    this.loop(() => this.topics.refresh(), TOPICS_POLL_MS);
    window.addEventListener("hashchange", () => {
      const wanted = new URLSearchParams(location.hash.slice(1));
      if (wanted.get("job")) this.choose(wanted.get("job"), wanted.get("output"));
    });
  }

  /** The sign-in form, shown when the service refuses a request for want of a token. */
  setUpSignIn() {
    const form = $("sign-in");
    const error = $("sign-in-error");
    window.addEventListener("kf:sign-in-needed", () => {
      form.hidden = false;
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const field = form.elements.namedItem("token");
      try {
        await signIn(field.value);
      } catch (err) {
        error.hidden = false;
        error.textContent = err.message;
        return;
      }
      field.value = "";
      error.hidden = true;
      form.hidden = true;
      this.restart();
      this.showSession();
    });
    $("sign-out").addEventListener("click", async () => {
      await signOut().catch(() => {});
      this.restart();
      this.showSession();
    });
    this.showSession();
  }

  async showSession() {
    const who = $("who");
    const out = $("sign-out");
    const answer = await session().catch(() => null);
    const signedIn = Boolean(answer && answer.token);
    who.hidden = out.hidden = !signedIn;
    who.textContent = signedIn ? `${answer.token} (${answer.scope})` : "";
    if (answer && answer.tokens_required && !signedIn) $("sign-in").hidden = false;
  }

  /** Open the streams again, with the session the page has now. */
  restart() {
    this.results.hide();
    this.letters.close();
  }

  /** `work` now and again `every` ms after each run ends: never two at once. */
  loop(work, every) {
    const run = async () => {
      try {
        await work();
      } catch (err) {
        console.error(err);
      }
      setTimeout(run, every);
    };
    run();
  }

  async poll() {
    const updated = $("updated");
    try {
      this.showHealth(await request("/v1/health"));
    } catch (err) {
      updated.textContent = `service not answering: ${err.message}`;
      updated.dataset.state = "down";
      this.showHealth(null);
      return;
    }
    try {
      const jobs = await request("/v1/jobs");
      this.showJobs(jobs.items || []);
      if (this.job) await this.pollJob();
      updated.textContent = `live · ${new Date().toLocaleTimeString()}`;
      updated.dataset.state = "live";
    } catch (err) {
      updated.textContent = err.status === 401 ? "signed out" : err.message;
      updated.dataset.state = "down";
    }
  }

  showHealth(health) {
    const list = $("services");
    const items = [["service", Boolean(health && health.status === "ok"),
      health ? `kappaflow ${health.version}` : "not answering"]];
    for (const [name, value] of Object.entries(health || {})) {
      if (typeof value === "boolean") items.push([name.replaceAll("_", " "), value, ""]);
      else if (value && typeof value === "object" && !Array.isArray(value)) {
        for (const [part, state] of Object.entries(value)) {
          const up = typeof state === "boolean" ? state
            : Boolean(state && (state.up ?? state.ok ?? ["running", "ok", "up"].includes(state.state ?? state.status ?? state)));
          items.push([part.replaceAll("_", " "), up, ""]);
        }
      }
    }
    list.replaceChildren(...items.map(([name, up, title]) => {
      const li = text("li", name, up ? "up" : "down");
      li.dataset.service = name;
      li.dataset.up = String(up);
      li.title = title || (up ? "up" : "down");
      return li;
    }));
  }

  showJobs(jobs) {
    const body = $("jobs").querySelector("tbody");
    $("no-jobs").hidden = jobs.length > 0;
    body.replaceChildren(...jobs.map((job) => {
      const tr = text("tr", undefined, job.name === this.job ? "pick chosen" : "pick");
      tr.dataset.job = job.name;
      tr.tabIndex = 0;
      tr.appendChild(text("td", job.name));
      const state = text("td", job.state, `state ${job.state}`);
      state.dataset.testid = "state";
      tr.appendChild(state);
      tr.appendChild(text("td", job.pipeline));
      tr.appendChild(text("td", watermark(job.started_at)));
      const choose = () => this.choose(job.name, null);
      tr.addEventListener("click", choose);
      tr.addEventListener("keydown", (e) => e.key === "Enter" && choose());
      return tr;
    }));
    if (!this.job && jobs.length) {
      const first = jobs.find((j) => j.state === "running") || jobs[0];
      this.choose(first.name, this.output);
    }
  }

  choose(job, output) {
    if (job !== this.job) {
      this.job = job;
      this.plan = null;
      this.output = output;
      this.results.hide();
      this.letters.close();
      $("shadow").hidden = true;
      $("outputs").querySelector("tbody").replaceChildren();
    } else if (output) {
      this.output = output;
    }
    for (const tr of $("jobs").querySelectorAll("tr[data-job]")) {
      tr.classList.toggle("chosen", tr.dataset.job === job);
    }
    const hash = new URLSearchParams({ job });
    if (this.output) hash.set("output", this.output);
    history.replaceState(null, "", `#${hash}`);
    this.pollJob().catch(() => {});
  }

  async pollJob() {
    const job = this.job;
    const status = await request(`/v1/jobs/${encodeURIComponent(job)}`);
    if (job !== this.job) return;
    this.plan = status.plan || null;
    $("job").hidden = false;
    $("job-name").textContent = job;
    const state = $("job-state");
    state.textContent = status.state;
    state.className = `state ${status.state}`;
    const error = $("job-error");
    error.hidden = !status.error;
    error.textContent = status.error || "";

    // The outputs in the plan, with the numbers of those that have run a batch.
    const planned = (this.plan && this.plan.outputs) || [];
    const outputs = Object.fromEntries(planned.map((o) => [o.name, {}]));
    Object.assign(outputs, status.outputs || {});
    const names = Object.keys(outputs);
    const now = Date.now();
    for (const name of names) {
      const key = `${job}/${name}`;
      const points = this.history.get(key) || [];
      points.push({ t: now, row: outputs[name] });
      if (points.length > HISTORY) points.splice(0, points.length - HISTORY);
      this.history.set(key, points);
    }
    if (!this.output || !names.includes(this.output)) {
      const windowed = planned.find((o) => o.window && names.includes(o.name));
      this.output = windowed ? windowed.name : names[0] || null;
    }
    this.showOutputs(outputs);
    this.drawCharts();
    if (this.output) {
      const described = planned.find((o) => o.name === this.output);
      this.results.show(job, this.output, described);
    }
    this.letters.show(job, this.plan);
    this.shadow.show(job).catch(() => {});
  }

  showOutputs(outputs) {
    const body = $("outputs").querySelector("tbody");
    body.replaceChildren(...Object.entries(outputs).map(([name, row]) => {
      const tr = text("tr", undefined, name === this.output ? "pick chosen" : "pick");
      tr.dataset.output = name;
      tr.tabIndex = 0;
      tr.title = "show this output's charts and results";
      tr.appendChild(text("th", name));
      for (const [field, shown] of FIELDS) {
        const td = text("td", shown(row[field]), "num");
        td.dataset.field = field;
        td.dataset.value = row[field] === null || row[field] === undefined ? "" : String(row[field]);
        tr.appendChild(td);
      }
      const choose = () => this.choose(this.job, name);
      tr.addEventListener("click", choose);
      tr.addEventListener("keydown", (e) => e.key === "Enter" && choose());
      return tr;
    }));
  }

  drawCharts() {
    const points = this.history.get(`${this.job}/${this.output}`) || [];
    $("charts").dataset.output = this.output || "";
    for (const [chart, series] of this.charts) {
      chart.draw(points.map((p) => ({ t: p.t, v: series.map(([, field]) => p.row[field] ?? null) })));
    }
  }
}

new Dashboard().start();
