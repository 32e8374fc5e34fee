// A job's shadow against it (`kappaflow jobs diff`): per output, the windows whose final
// values differ, the aggregates added or removed, and the first difference. The diff reads
// both jobs' topics, so it is asked for now and then, not at every poll.

import { request } from "./api.js";

const DIFF_MS = 10000;
const COUNTS = ["equal", "different", "only_live", "only_shadow", "pending", "before_shadow"];

function cell(tag, content) {
  const node = document.createElement(tag);
  node.textContent = content;
  return node;
}

export class ShadowView {
  constructor(panel) {
    this.panel = panel;
    this.job = null;
    this.asked = 0;
  }

  async show(job) {
    if (job === this.job && Date.now() - this.asked < DIFF_MS) return;
    this.job = job;
    this.asked = Date.now();
    let diff;
    try {
      diff = await request(`/v1/jobs/${encodeURIComponent(job)}/diff`);
    } catch (err) {
      if (err.status === 404) {
        this.panel.hidden = true; // no shadow (KF792)
        return;
      }
      throw err;
    }
    if (job !== this.job) return;
    this.panel.hidden = false;
    this.panel.querySelector("[data-testid=shadow-name]").textContent =
      `${diff.shadow} (${diff.shadow_state}, ${diff.app})`;
    const body = this.panel.querySelector("tbody");
    body.replaceChildren(...diff.outputs.map((output) => {
      const tr = document.createElement("tr");
      tr.dataset.output = output.output;
      tr.appendChild(cell("th", output.output));
      if (output.status !== "compared") {
        const td = cell("td", `output ${output.status}`);
        td.colSpan = COUNTS.length + 2;
        tr.appendChild(td);
        return tr;
      }
      for (const count of COUNTS) {
        const td = cell("td", String(output.windows[count]));
        td.className = "num";
        td.dataset.field = count;
        tr.appendChild(td);
      }
      const { added, removed } = output.aggregates;
      tr.appendChild(cell("td", [...added.map((a) => `+${a}`), ...removed.map((a) => `-${a}`)].join(" ")));
      const first = output.first_difference;
      const td = cell("td", first
        ? `${first.window_start} ${JSON.stringify(first.key)}: live ${JSON.stringify(first.live)}, shadow ${JSON.stringify(first.shadow)}`
        : "");
      td.dataset.field = "first_difference";
      tr.appendChild(td);
      return tr;
    }));
  }
}
