// report.html's script: draws the run's series from the JSON that `launch`
// inlined (src/cli/report.cc). Charts are kept in window.hetpsCharts by
// name with their data, for tests.
"use strict";

const DATA = JSON.parse(document.getElementById("data").textContent);
const T = DATA.timeline;
const S = DATA.summary;
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const charts = {};
window.hetpsCharts = charts;

function chart(name, title, x, columns, xlabel) {
  const labels = Object.keys(columns);
  if (x.length === 0 || labels.length === 0) return;
  const box = document.createElement("div");
  box.id = "chart-" + name;
  const h = document.createElement("h2");
  h.textContent = title;
  box.appendChild(h);
  document.getElementById("charts").appendChild(box);
  const data = [x].concat(labels.map(l => columns[l]));
  const series = [{ label: "s" }].concat(labels.map((label, i) => ({
    label, stroke: PALETTE[i % PALETTE.length], width: 1.5 })));
  const plot = new uPlot({
    width: 540, height: 220, series, scales: { x: { time: false } },
    axes: [{ label: xlabel || "seconds since start" }, {}],
  }, data, box);
  charts[name] = { plot, labels, data, points: () => x.length };
}

function perWorker(field) {
  const out = {};
  for (const [rank, c] of Object.entries(T.workers)) {
    out["worker " + rank] = c[field];
  }
  return out;
}

function perServer(field) {
  const out = {};
  for (const [rank, c] of Object.entries(T.servers)) {
    out["server " + rank] = c[field];
  }
  return out;
}

// Test AUC: rank 0's evaluations (periodic ones with train.eval_every_s,
// one per epoch, the final model).
const evals = (S.evals || []).filter(e => e.at_s !== undefined);
chart("auc", "Test AUC (rank 0's evaluations)", evals.map(e => e.at_s),
      { "test AUC": evals.map(e => e.auc) });
chart("throughput", "Samples/s per worker", T.t, perWorker("samples_per_s"));
chart("busy", "Busy fraction per worker", T.t, perWorker("busy"));
chart("batch", "Batch size per worker", T.t, perWorker("batch"));
chart("window", "semi_async window", T.t, { window: T.window });
chart("queue", "Queue length per server", T.t, perServer("queue"));
const codec = {};
for (const [name, bytes] of Object.entries(T.codec_bytes)) {
  codec[name + " (MB)"] = bytes.map(b => b === null ? null : b / 1e6);
}
chart("codec", "Gradient bytes sent per codec (cumulative)", T.t, codec);

document.getElementById("title").textContent =
  `hetps run report · ${S.job || ""} · ${S.mode || ""}`;
const lines = [
  `test AUC ${(S.test_auc || 0).toFixed(4)}, logloss ` +
    `${(S.test_logloss || 0).toFixed(4)}`,
  `${S.samples} samples in ${(S.wall_s || 0).toFixed(1)} s ` +
    `(${(S.samples_per_s || 0).toFixed(0)} samples/s), ` +
    `compression ${(S.compression_ratio || 1).toFixed(2)}×`,
];
for (const w of S.per_worker || []) {
  lines.push(`worker ${w.rank}: ${w.samples} samples, busy ` +
             `${(100 * w.busy_fraction).toFixed(0)}%` +
             (w.device ? `, ${w.device}` : ""));
}
for (const w of S.warnings || []) {
  lines.push("warning: " + (typeof w === "string" ? w : JSON.stringify(w)));
}
for (const d of S.diagnostics || []) {
  lines.push(`warning: ${d.subject}: ${d.kind.replace(/_/g, " ")} — ` +
             `${d.message} (${d.first_s.toFixed(0)}–${d.last_s.toFixed(0)} s)`);
}
document.getElementById("summary").textContent = lines.join("\n");
document.getElementById("config").textContent = DATA.config;
