// The step timeline (a Gantt) of the execution page: draws what actors/ui/timeline.py
// computed as DOM: a row per step (<div class="tl-row" data-step="NAME">), a bar per
// attempt, retry delay or wait (<div class="tl-bar" data-attempt data-state data-kind>).
// Everything that comes from data goes in through textContent or setAttribute.
//
//   import { renderTimeline } from "/static/timeline.js";
//   renderTimeline(container, timeline);   // again on every update: it is cheap

const STYLE = `
.ag-timeline { --tl-running:#2563eb; --tl-completed:#16a34a; --tl-failed:#dc2626; --tl-cancelled:#475569;
  --tl-retrying:#d97706; --tl-pending:#94a3b8;
  font: 13px/1.3 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:#1e293b; }
.ag-timeline .tl-legend { display:flex; flex-wrap:wrap; gap:4px 12px; font-size:12px; color:#475569; margin:0 0 8px; }
.ag-timeline .tl-key { display:inline-flex; align-items:center; gap:5px; }
.ag-timeline .tl-key .tl-bar { position:static; display:inline-block; width:22px; height:10px; }
.ag-timeline .tl-grid { display:grid; grid-template-columns: minmax(90px, 180px) 1fr; border:1px solid #e2e8f0;
  border-radius:8px; overflow:hidden; background:#fff; }
.ag-timeline .tl-head { display:contents; }
.ag-timeline .tl-head > div { background:#f8fafc; border-bottom:1px solid #e2e8f0; height:24px; }
.ag-timeline .tl-corner { font-size:11px; color:#64748b; padding:5px 10px; box-sizing:border-box; }
.ag-timeline .tl-axis { position:relative; margin-right:12px; }
.ag-timeline .tl-tick { position:absolute; top:5px; font-size:11px; color:#64748b; transform:translateX(-50%);
  white-space:nowrap; font-variant-numeric:tabular-nums; }
.ag-timeline .tl-row { display:contents; }
.ag-timeline .tl-label { padding:0 10px; display:flex; align-items:center; gap:6px; font-weight:600; font-size:12px;
  border-bottom:1px solid #f1f5f9; overflow:hidden; white-space:nowrap; text-overflow:ellipsis; }
.ag-timeline .tl-label .tl-tag { font-weight:500; font-size:10px; color:#64748b; border:1px solid #cbd5e1;
  border-radius:4px; padding:0 4px; }
.ag-timeline .tl-track { position:relative; border-bottom:1px solid #f1f5f9; margin-right:12px;
  background-image:linear-gradient(to right, #f1f5f9 1px, transparent 1px); }
.ag-timeline .tl-bar { position:absolute; height:12px; min-width:3px; border-radius:3px; box-sizing:border-box; }
.ag-timeline .tl-bar.kind-run.state-running { background:var(--tl-running); animation: tl-pulse 1.6s ease-in-out infinite; }
.ag-timeline .tl-bar.kind-run.state-completed { background:var(--tl-completed); }
.ag-timeline .tl-bar.kind-run.state-failed { background:var(--tl-failed); }
.ag-timeline .tl-bar.kind-run.state-cancelled { background:var(--tl-cancelled); }
.ag-timeline .tl-bar.kind-run.state-pending { background:var(--tl-pending); }
.ag-timeline .tl-bar.kind-delay { background:repeating-linear-gradient(135deg, #fde68a 0 4px, #fef3c7 4px 8px);
  border:1px solid var(--tl-retrying); }
.ag-timeline .tl-bar.kind-delay.state-cancelled { border-color:var(--tl-cancelled); opacity:0.7; }
.ag-timeline .tl-bar.kind-waiting { background:repeating-linear-gradient(135deg, #e2e8f0 0 4px, #f8fafc 4px 8px);
  border:1px dashed var(--tl-pending); }
.ag-timeline .tl-empty { padding:12px; color:#64748b; }
@keyframes tl-pulse { 50% { opacity:0.55; } }
@media (prefers-reduced-motion: reduce) { .ag-timeline .tl-bar { animation:none !important; } }
`;

const LANE = 18; // px per lane of a row: concurrent bars of one step (two visits at once) stack
const PAD = 5;

function installStyle() {
  if (document.getElementById("ag-timeline-style")) return;
  const style = document.createElement("style");
  style.id = "ag-timeline-style";
  style.textContent = STYLE;
  document.head.appendChild(style);
}

function html(name, attrs = {}, parent = null, text = null) {
  const node = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

/** A duration for people: 850ms, 1.2s, 3m 20s, 1h 5m. */
export function duration(seconds) {
  const s = Math.max(0, seconds);
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s < 10 ? s.toFixed(2).replace(/\.?0+$/, "") : s.toFixed(1).replace(/\.0$/, "")}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.round((s % 3600) / 60)}m`;
}

function tickStep(span) {
  const target = span / 6;
  for (const unit of [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]) {
    if (unit >= target) return unit;
  }
  return 86400 * Math.ceil(target / 86400);
}

function barTitle(step, bar, end) {
  const what = bar.kind === "delay" ? "retry delay before attempt" : bar.kind === "waiting" ? "waiting to start, attempt" : "attempt";
  const lines = [`${step}: ${what} ${bar.attempt}`];
  if (bar.loop) lines.push(`loop of ${bar.loop.size}: ${bar.loop.succeeded} succeeded, ${bar.loop.failed} failed`);
  lines.push(`${bar.state}, ${duration(end - bar.start)}${bar.end === null ? " so far" : ""}`);
  if (bar.error) lines.push(`error: ${bar.error}`);
  return lines.join("\n");
}

function lanes(bars, now) {
  // greedy: each bar in the first lane whose last bar ended before it starts
  const ends = [];
  return bars.map((bar) => {
    const end = bar.end ?? now;
    let lane = ends.findIndex((e) => e <= bar.start + 1e-9);
    if (lane < 0) {
      lane = ends.length;
      ends.push(end);
    } else {
      ends[lane] = end;
    }
    return lane;
  });
}

/** Draws `timeline` (actors/ui/timeline.py's JSON) into `container`, replacing what it held. */
export function renderTimeline(container, timeline) {
  installStyle();
  container.replaceChildren();
  container.classList.add("ag-timeline");
  const legend = html("div", { class: "tl-legend", role: "list", "aria-label": "legend" }, container);
  for (const [kind, state, text] of [
    ["run", "running", "running"], ["run", "completed", "completed"], ["run", "failed", "failed"],
    ["run", "cancelled", "cancelled"], ["delay", "retrying", "retry delay (backoff)"], ["waiting", "pending", "waiting to start"],
  ]) {
    const key = html("span", { class: "tl-key", role: "listitem" }, legend);
    html("span", { class: `tl-bar kind-${kind} state-${state}` }, key);
    html("span", {}, key, text);
  }
  const rows = timeline.rows || [];
  if (!rows.length || timeline.start === null || timeline.start === undefined) {
    html("div", { class: "tl-empty" }, container, "No step has started yet.");
    return;
  }
  const start = timeline.start;
  let last = timeline.end ?? start;
  for (const row of rows) for (const bar of row.bars) last = Math.max(last, bar.end ?? bar.start);
  const now = timeline.end ?? Math.max(last, Date.now() / 1000);
  const span = Math.max(now - start, 0.001);
  const pct = (t) => `${(((t - start) / span) * 100).toFixed(3)}%`;

  const grid = html("div", { class: "tl-grid", role: "table", "aria-label": "step timeline" }, container);
  const head = html("div", { class: "tl-head", role: "row" }, grid);
  html("div", { class: "tl-corner", role: "columnheader" }, head, `step · ${duration(span)}`);
  const axis = html("div", { class: "tl-axis", role: "columnheader" }, head);
  const step = tickStep(span);
  for (let t = 0; t <= span + 1e-9; t += step) {
    html("span", { class: "tl-tick", style: `left:${((t / span) * 100).toFixed(3)}%` }, axis, t === 0 ? "0" : `+${duration(t)}`);
  }
  const gridlines = `background-size:${((step / span) * 100).toFixed(4)}% 100%`;
  for (const row of rows) {
    const lane = lanes(row.bars, now);
    const height = Math.max(1, ...lane.map((l) => l + 1)) * LANE + 2 * PAD - (LANE - 12);
    const line = html("div", { class: "tl-row", role: "row", "data-step": row.step, "data-loop": row.loop ? "true" : "false" }, grid);
    const label = html("div", { class: "tl-label", role: "rowheader", title: row.step, style: `height:${height}px` }, line, row.step);
    if (row.loop) html("span", { class: "tl-tag" }, label, "loop");
    const track = html("div", { class: "tl-track", role: "cell", style: `height:${height}px;${gridlines}` }, line);
    row.bars.forEach((bar, i) => {
      const end = bar.end ?? now;
      html("div", {
        class: `tl-bar kind-${bar.kind} state-${bar.state}`,
        "data-attempt": bar.attempt,
        "data-state": bar.state,
        "data-kind": bar.kind,
        "data-start": bar.start,
        "data-end": bar.end ?? "",
        title: barTitle(row.step, bar, end),
        style: `left:${pct(bar.start)};width:calc(${pct(end)} - ${pct(bar.start)});top:${PAD + lane[i] * LANE}px`,
      }, track);
    });
  }
}
