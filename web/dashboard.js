// The live dashboard: polls the coordinator's /api/status (the same values
// as `hetps status`) once a second and draws each series over the time the
// page has been open. Charts are kept in window.hetpsCharts by name, for
// tests and the curious.
"use strict";

const token = new URLSearchParams(location.search).get("token");
const POLL_MS = 1000;
const KEEP = 3600;  // points per series: an hour at one per second

// name → {title, unit, series(status) → {label: value}}
const CHARTS = [
  { name: "auc", title: "Test AUC (rank 0's latest evaluation)",
    series: s => {
      const w = s.workers.find(w => w.rank === 0);
      return w && w.progress.test_auc_at_s > 0 ?
        { "test AUC": w.progress.test_auc } : {};
    } },
  { name: "throughput", title: "Samples/s per worker",
    series: s => perWorker(s, w => w.progress.samples_per_s) },
  { name: "busy", title: "Busy fraction per worker",
    series: s => perWorker(s, w => w.progress.busy_fraction) },
  { name: "batch", title: "Batch size per worker",
    series: s => perWorker(s, w => w.progress.batch_size) },
  { name: "window", title: "semi_async window",
    series: s => ({ window: s.window }) },
  { name: "queue", title: "Queue length per server",
    series: s => perServer(s, v => v.stats.queue_length) },
  { name: "progress", title: "Data handed out (%)",
    series: s => ({ progress: s.chunks_total ?
      100 * s.chunks_given / s.chunks_total : 0 }) },
];

function perWorker(status, value) {
  const out = {};
  for (const w of status.workers) out["worker " + w.rank] = value(w);
  return out;
}
function perServer(status, value) {
  const out = {};
  for (const v of status.servers) {
    if (v.reachable) out["server " + v.rank] = value(v);
  }
  return out;
}

const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

// One chart: its x (seconds since the job started) and a column per label;
// a label seen late is added with gaps before it.
class Chart {
  constructor(spec, parent) {
    this.spec = spec;
    this.labels = [];
    this.data = [[]];
    const box = document.createElement("div");
    box.className = "chart";
    box.id = "chart-" + spec.name;
    box.innerHTML = "<h2></h2>";
    box.firstChild.textContent = spec.title;
    parent.appendChild(box);
    this.box = box;
    this.plot = null;
  }

  add(t, values) {
    for (const label of Object.keys(values)) {
      if (!this.labels.includes(label)) {
        this.labels.push(label);
        this.data.push(this.data[0].map(() => null));
        this.rebuild();
      }
    }
    this.data[0].push(t);
    this.labels.forEach((label, i) => {
      const v = values[label];
      this.data[i + 1].push(v === undefined ? null : v);
    });
    if (this.data[0].length > KEEP) this.data.forEach(col => col.shift());
    if (!this.plot) this.rebuild();
    this.plot.setData(this.data);
  }

  rebuild() {
    if (this.plot) this.plot.destroy();
    const series = [{ label: "s" }].concat(this.labels.map((label, i) => ({
      label, stroke: PALETTE[i % PALETTE.length], width: 1.5 })));
    this.plot = new uPlot({
      width: 540, height: 220, series,
      scales: { x: { time: false } },
      axes: [{ label: "seconds since start" }, {}],
    }, this.data, this.box);
  }

  // Points drawn so far (tests read this).
  points() { return this.data[0].length; }
}

const charts = {};
window.hetpsCharts = charts;

function summary(s) {
  const live = s.workers.filter(w => w.live).length;
  const pct = s.chunks_total ? (100 * s.chunks_given / s.chunks_total) : 0;
  return `mode ${s.mode} · window ${s.window} · ${live}/${s.workers.length}` +
    ` workers live · ${s.servers.length} servers · data ${pct.toFixed(0)}%` +
    ` · ${s.elapsed_s.toFixed(0)} s`;
}

async function poll() {
  try {
    const url = "api/status" + (token ? "?token=" + encodeURIComponent(token) : "");
    const reply = await fetch(url, { cache: "no-store" });
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    const s = await reply.json();
    document.getElementById("title").textContent = "hetps · " + s.mode;
    document.getElementById("summary").textContent = summary(s);
    // The coordinator's diagnostics (src/coord/diagnostics.h), as raised.
    document.getElementById("warnings").replaceChildren(
      ...(s.diagnostics || []).map(d => {
        const line = document.createElement("div");
        line.className = d.active ? "warning active" : "warning";
        line.textContent = `⚠ ${d.subject}: ${d.kind.replace(/_/g, " ")} — ` +
          `${d.message} (${d.first_s.toFixed(0)}–${d.last_s.toFixed(0)} s)`;
        return line;
      }));
    const parent = document.getElementById("charts");
    for (const spec of CHARTS) {
      if (!charts[spec.name]) charts[spec.name] = new Chart(spec, parent);
      charts[spec.name].add(s.elapsed_s, spec.series(s));
    }
  } catch (e) {
    document.getElementById("summary").textContent =
      "no answer from the coordinator (" + e.message + "): the job may have ended";
  }
  setTimeout(poll, POLL_MS);
}

poll();
