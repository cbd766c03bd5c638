// The playbook graph of the execution page: draws what actors/ui/graph.py computed
// (nodes, edges, their points: the layout is done in Python) as SVG with real text.
// Every node is <g class="node state-S" data-step="NAME" data-state="S">, so a
// browser test and a screen reader can read names and states. Everything that comes
// from data goes in through textContent or setAttribute, never as markup.
//
//   import { renderGraph, updateGraph } from "/static/graph.js";
//   renderGraph(container, graph);   // once
//   updateGraph(container, graph);   // on every update: re-colours in place when only
//                                    // states changed, re-renders when the layout did
//   container.addEventListener("step-select", (e) => e.detail.step);  // a node clicked
//                                    // (or Enter on a focused node)

const SVG = "http://www.w3.org/2000/svg";

export const STATES = ["pending", "running", "retrying", "completed", "failed", "cancelled", "skipped"];
const EDGE_KINDS = [
  ["next", "next"],
  ["join", "join at end"],
  ["on_failure", "on_failure (remediation)"],
  ["on_error", "on_error decision"],
];
const MIN_SCALE = 0.1;
const MAX_SCALE = 2.5;
const MAX_HEIGHT = 640; // px of page the graph may take before it pans
const READABLE = 0.6; // the smallest scale a graph starts at: below it, text is too small to read

const STYLE = `
.ag-graph { --ag-pending:#8a94a6; --ag-running:#2563eb; --ag-retrying:#d97706; --ag-completed:#16a34a;
  --ag-failed:#dc2626; --ag-cancelled:#475569; --ag-skipped:#c4cad4; --ag-edge:#94a3b8;
  --ag-fail-edge:#dc2626; --ag-error-edge:#b45309;
  font: 13px/1.3 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:#1e293b; }
.ag-graph .ag-bar { display:flex; flex-wrap:wrap; align-items:center; gap:6px 14px; margin:0 0 8px; }
.ag-graph .ag-legend { display:flex; flex-wrap:wrap; gap:4px 12px; font-size:12px; color:#475569; }
.ag-graph .ag-key { display:inline-flex; align-items:center; gap:5px; }
.ag-graph .ag-swatch { width:12px; height:12px; border-radius:3px; border:2px solid; box-sizing:border-box; }
.ag-graph .ag-line { width:22px; height:0; border-top:2px solid var(--ag-edge); }
.ag-graph .ag-line.kind-on_failure { border-top:2px dashed var(--ag-fail-edge); }
.ag-graph .ag-line.kind-on_error { border-top:2px dotted var(--ag-error-edge); }
.ag-graph .ag-zoom { margin-left:auto; display:inline-flex; gap:4px; }
.ag-graph .ag-zoom button { font:inherit; min-width:28px; padding:2px 8px; border:1px solid #cbd5e1;
  background:#fff; border-radius:6px; cursor:pointer; }
.ag-graph .ag-zoom button:hover { background:#f1f5f9; }
.ag-graph .ag-viewport { border:1px solid #e2e8f0; border-radius:8px; background:#fbfcfe; overflow:hidden;
  cursor:grab; touch-action:none; }
.ag-graph .ag-viewport.dragging { cursor:grabbing; }
.ag-graph svg { display:block; width:100%; user-select:none; }
.ag-graph .node-box { fill:#fff; stroke-width:2; }
.ag-graph .node-stripe { stroke:none; }
.ag-graph .node-label { font-weight:600; font-size:13px; fill:#0f172a; }
.ag-graph .node-sub { font-size:11px; fill:#64748b; }
.ag-graph .node-badge { font-size:11px; fill:#64748b; }
.ag-graph .node { cursor:pointer; }
.ag-graph .node:focus { outline:none; }
.ag-graph .node:focus .node-box { stroke-width:3; }
.ag-graph .loop-track { fill:#e2e8f0; }
.ag-graph .loop-fill { fill:var(--ag-completed); }
.ag-graph .loop-failed { fill:var(--ag-failed); }
.ag-graph .loop-text { font-size:11px; fill:#334155; font-variant-numeric:tabular-nums; }
${STATES.map((s) => `.ag-graph .state-${s} .node-box { stroke:var(--ag-${s}); }
.ag-graph .state-${s} .node-stripe, .ag-graph .ag-swatch.state-${s} { fill:var(--ag-${s}); border-color:var(--ag-${s}); }`).join("\n")}
.ag-graph .ag-swatch.state-pending { background:#f8fafc; } .ag-graph .ag-swatch.state-running { background:#dbeafe; }
.ag-graph .ag-swatch.state-retrying { background:#fef3c7; } .ag-graph .ag-swatch.state-completed { background:#dcfce7; }
.ag-graph .ag-swatch.state-failed { background:#fee2e2; } .ag-graph .ag-swatch.state-cancelled { background:#e2e8f0; }
.ag-graph .ag-swatch.state-skipped { background:#fff; border-style:dashed; }
.ag-graph .state-pending .node-box { fill:#f8fafc; }
.ag-graph .state-running .node-box { fill:#eff6ff; }
.ag-graph .state-retrying .node-box { fill:#fffbeb; }
.ag-graph .state-completed .node-box { fill:#f0fdf4; }
.ag-graph .state-failed .node-box { fill:#fef2f2; }
.ag-graph .state-cancelled .node-box { fill:#f1f5f9; }
.ag-graph .state-skipped .node-box { fill:#fff; stroke-dasharray:5 4; }
.ag-graph .state-skipped .node-label, .ag-graph .state-skipped .node-sub { fill:#94a3b8; }
.ag-graph .state-running .node-box, .ag-graph .state-retrying .node-box { animation: ag-pulse 1.6s ease-in-out infinite; }
@keyframes ag-pulse { 50% { stroke-opacity:0.35; } }
@media (prefers-reduced-motion: reduce) { .ag-graph .node-box { animation:none !important; } }
.ag-graph .edge path { fill:none; stroke:var(--ag-edge); stroke-width:1.6; }
.ag-graph .edge.taken path { stroke:#475569; stroke-width:2.4; }
.ag-graph .edge.kind-on_failure path { stroke:var(--ag-fail-edge); stroke-dasharray:7 5; }
.ag-graph .edge.kind-on_error path { stroke:var(--ag-error-edge); stroke-dasharray:2 4; stroke-linecap:round; }
.ag-graph .edge.kind-on_failure.taken path, .ag-graph .edge.kind-on_error.taken path { stroke-width:2.6; }
.ag-graph .edge-label { font-size:11px; fill:#475569; paint-order:stroke; stroke:#fbfcfe; stroke-width:4px;
  stroke-linejoin:round; }
.ag-graph .edge.kind-on_failure .edge-label { fill:#b91c1c; }
.ag-graph .edge.kind-on_error .edge-label { fill:#92400e; }
.ag-graph .edge.taken .edge-label { font-weight:600; }
`;

function installStyle() {
  if (document.getElementById("ag-graph-style")) return;
  const style = document.createElement("style");
  style.id = "ag-graph-style";
  style.textContent = STYLE;
  document.head.appendChild(style);
}

function svg(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function html(name, attrs = {}, parent = null, text = null) {
  const node = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function cut(text, max) {
  const s = String(text ?? "");
  return s.length <= max ? s : s.slice(0, Math.max(1, max - 1)) + "…";
}

function fmtRate(rate) {
  if (rate === null || rate === undefined) return "–/s";
  if (rate >= 100) return `${Math.round(rate).toLocaleString("en-US")}/s`;
  return `${Number(rate).toFixed(1)}/s`;
}

/** "done/total · rate/s · in flight · failed" of a loop node, as its two lines. */
export function loopLines(loop) {
  const total = loop.total === null || loop.total === undefined ? "?" : loop.total.toLocaleString("en-US");
  return [
    `${loop.done.toLocaleString("en-US")}/${total} · ${fmtRate(loop.rate)} · `,
    `${loop.in_flight.toLocaleString("en-US")} in flight · ${loop.failed.toLocaleString("en-US")} failed`,
  ];
}

export function loopText(loop) {
  return loopLines(loop).join("");
}

function nodeTitle(node) {
  const lines = [`${node.id} (${node.kind === node.tool ? node.kind : `${node.kind}, ${node.tool}`})`];
  if (node.desc) lines.push(node.desc);
  lines.push(`state: ${node.state}${node.handled ? " (handled)" : ""}${node.kept ? " (kept from the execution retried)" : ""}`);
  lines.push(`attempts: ${node.attempts}` + (node.visits > 1 ? ` over ${node.visits} visits` : ""));
  if (node.loop) lines.push(`loop: ${loopText(node.loop)}`);
  if (node.retry) lines.push(`retry: ${node.retry}`);
  for (const rule of node.on_error || []) lines.push(`on_error: ${rule.when ? `${rule.when} → ` : ""}${rule.decision}`);
  if (node.decision) lines.push(`decision taken: ${node.decision}`);
  if (node.child) lines.push(`child playbook: ${node.child}`);
  if (node.children && node.children.length) lines.push(`child executions: ${node.children.join(", ")}`);
  if (node.error) lines.push(`last error: ${node.error}`);
  return lines.join("\n");
}

function subText(node) {
  const parts = [node.kind === "loop" ? `loop · ${node.tool}` : node.kind, node.state];
  if (node.attempts > 1) parts.push(`×${node.attempts}`);
  return parts.join(" · ");
}

function curve(points, selfLoop) {
  const p = points;
  if (selfLoop && p.length === 4) {
    return `M${p[0][0]},${p[0][1]} C${p[1][0]},${p[1][1]} ${p[2][0]},${p[2][1]} ${p[3][0]},${p[3][1]}`;
  }
  let d = `M${p[0][0]},${p[0][1]}`;
  for (let i = 1; i < p.length; i++) {
    const [x0, y0] = p[i - 1];
    const [x1, y1] = p[i];
    const dx = (x1 - x0) / 2;
    d += ` C${x0 + dx},${y0} ${x1 - dx},${y1} ${x1},${y1}`;
  }
  return d;
}

function drawLegend(bar) {
  const legend = html("div", { class: "ag-legend", role: "list", "aria-label": "legend" }, bar);
  for (const state of STATES) {
    const key = html("span", { class: "ag-key", role: "listitem", "data-legend": state }, legend);
    html("span", { class: `ag-swatch state-${state}` }, key);
    html("span", {}, key, state);
  }
  for (const [kind, text] of EDGE_KINDS) {
    const key = html("span", { class: "ag-key", role: "listitem", "data-legend": kind }, legend);
    html("span", { class: `ag-line kind-${kind}` }, key);
    html("span", {}, key, text);
  }
}

function drawEdge(parent, edge) {
  const g = svg("g", { class: `edge kind-${edge.kind}`, "data-from": edge.from, "data-to": edge.to, "data-kind": edge.kind }, parent);
  if (edge.taken) g.classList.add("taken");
  if (!edge.points || edge.points.length < 2) return g;
  const title = svg("title", {}, g);
  title.textContent = `${edge.from} → ${edge.to} (${edge.kind})` + (edge.title ? `: ${edge.title}` : "");
  const marker = edge.kind === "on_failure" ? "ag-arrow-fail" : edge.kind === "on_error" ? "ag-arrow-error" : "ag-arrow";
  const path = svg("path", { d: curve(edge.points, edge.from === edge.to) }, g);
  // an edge that joins a shared line ends there: the line carries the arrow into the step
  if (edge.merges === null || edge.merges === undefined) path.setAttribute("marker-end", `url(#${marker})`);
  if (edge.label && edge.label_at) {
    const label = svg("text", { class: "edge-label", x: edge.label_at[0], y: edge.label_at[1] - 5, "text-anchor": "middle" }, g);
    label.textContent = edge.label;
  }
  return g;
}

function drawNode(parent, node) {
  const g = svg("g", {
    class: `node state-${node.state} kind-${node.kind}`,
    "data-step": node.id,
    "data-state": node.state,
    "data-kind": node.kind,
    transform: `translate(${node.x},${node.y})`,
    tabindex: 0,
    role: "group",
  }, parent);
  const title = svg("title", {}, g);
  svg("rect", { class: "node-box", width: node.w, height: node.h, rx: 9 }, g);
  svg("rect", { class: "node-stripe", x: 1, y: 1, width: 6, height: node.h - 2, rx: 3 }, g);
  const badges = [];
  if (node.entry) badges.push("▶");
  if (node.retry) badges.push("↻");
  if (node.kind === "playbook" || node.child) badges.push("⊞");
  const maxChars = Math.floor((node.w - 26 - badges.length * 14) / 8.2);
  const label = svg("text", { class: "node-label", x: 16, y: 22 }, g);
  label.textContent = cut(node.label, maxChars);
  const sub = svg("text", { class: "node-sub", x: 16, y: 40 }, g);
  if (badges.length) {
    const badge = svg("text", { class: "node-badge", x: node.w - 10, y: 20, "text-anchor": "end" }, g);
    badge.textContent = badges.join(" ");
  }
  const parts = { g, title, sub };
  if (node.loop) {
    const width = node.w - 32;
    svg("rect", { class: "loop-track", x: 16, y: 50, width, height: 8, rx: 4 }, g);
    parts.fill = svg("rect", { class: "loop-fill", x: 16, y: 50, width: 0, height: 8, rx: 4 }, g);
    parts.failed = svg("rect", { class: "loop-failed", x: 16, y: 50, width: 0, height: 8 }, g);
    const text = svg("text", { class: "loop-text" }, g);
    parts.loopLines = [svg("tspan", { x: 16, y: 74 }, text), svg("tspan", { x: 16, y: 89 }, text)];
    parts.trackWidth = width;
  }
  paintNode(parts, node);
  return parts;
}

function paintNode(parts, node) {
  const { g } = parts;
  g.setAttribute("class", `node state-${node.state} kind-${node.kind}`);
  g.setAttribute("data-state", node.state);
  g.setAttribute("aria-label", `step ${node.id}: ${node.state}`);
  parts.title.textContent = nodeTitle(node);
  parts.sub.textContent = subText(node);
  if (parts.fill && node.loop) {
    const { done, failed, total } = node.loop;
    const share = (n) => (total ? Math.min(1, n / total) : 0) * parts.trackWidth;
    parts.fill.setAttribute("width", share(done).toFixed(1));
    parts.failed.setAttribute("x", (16 + share(done - failed)).toFixed(1));
    parts.failed.setAttribute("width", share(failed).toFixed(1));
    loopLines(node.loop).forEach((line, i) => { parts.loopLines[i].textContent = line; });
    g.setAttribute("data-done", String(done));
    g.setAttribute("data-total", total === null ? "" : String(total));
  }
}

function layoutKey(graph) {
  return graph.nodes.map((n) => `${n.id}:${n.x}:${n.y}:${n.w}:${n.h}`).join("|") + `#${graph.width}x${graph.height}`;
}

function markers(defs) {
  for (const [id, colour] of [["ag-arrow", "var(--ag-edge)"], ["ag-arrow-fail", "var(--ag-fail-edge)"], ["ag-arrow-error", "var(--ag-error-edge)"]]) {
    const m = svg("marker", { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerUnits: "userSpaceOnUse", markerWidth: 10, markerHeight: 10, orient: "auto-start-reverse" }, defs);
    svg("path", { d: "M0,0 L10,5 L0,10 z", style: `fill:${colour}` }, m);
  }
}

/** Draws `graph` (actors/ui/graph.py's JSON) into `container`, replacing what it held. */
export function renderGraph(container, graph) {
  installStyle();
  container.replaceChildren();
  container.classList.add("ag-graph");
  const bar = html("div", { class: "ag-bar" }, container);
  drawLegend(bar);
  const zoom = html("div", { class: "ag-zoom" }, bar);
  const viewport = html("div", { class: "ag-viewport" }, container);
  const height = Math.max(140, Math.min(graph.height, MAX_HEIGHT));
  const root = svg("svg", { role: "img", "aria-label": "playbook graph", height }, viewport);
  markers(svg("defs", {}, root));
  const scene = svg("g", { class: "ag-scene" }, root);
  const edgeLayer = svg("g", { class: "edges" }, scene);
  const nodeLayer = svg("g", { class: "nodes" }, scene);
  const edges = graph.edges.map((e) => [e, drawEdge(edgeLayer, e)]);
  const nodes = new Map(graph.nodes.map((n) => [n.id, drawNode(nodeLayer, n)]));
  const select = (ev) => {
    const node = ev.target.closest && ev.target.closest(".node");
    if (!node || (ev.type === "keydown" && ev.key !== "Enter")) return;
    container.dispatchEvent(new CustomEvent("step-select", { detail: { step: node.dataset.step }, bubbles: true }));
  };
  nodeLayer.addEventListener("click", select);
  nodeLayer.addEventListener("keydown", select);
  const view = { scale: 1, tx: 0, ty: 0 };
  const apply = () => scene.setAttribute("transform", `translate(${view.tx},${view.ty}) scale(${view.scale})`);
  const fit = () => {
    const width = viewport.clientWidth || graph.width;
    view.scale = Math.max(MIN_SCALE, Math.min(1, width / graph.width, height / graph.height));
    view.tx = Math.max(0, (width - graph.width * view.scale) / 2);
    view.ty = Math.max(0, (height - graph.height * view.scale) / 2);
    apply();
  };
  const start = () => {
    // a graph too big to read whole starts at its entry, at a readable size
    const width = viewport.clientWidth || graph.width;
    if (Math.min(width / graph.width, height / graph.height) >= READABLE) return fit();
    const entry = graph.nodes.find((n) => n.entry) || graph.nodes[0];
    view.scale = Math.max(READABLE, Math.min(1, height / graph.height));
    view.tx = 0;
    view.ty = entry ? height / 2 - (entry.y + entry.h / 2) * view.scale : 0;
    apply();
  };
  const zoomBy = (factor, cx, cy) => {
    const next = Math.max(MIN_SCALE, Math.min(MAX_SCALE, view.scale * factor));
    view.tx = cx - ((cx - view.tx) * next) / view.scale;
    view.ty = cy - ((cy - view.ty) * next) / view.scale;
    view.scale = next;
    apply();
  };
  for (const [text, label, act] of [
    ["−", "zoom out", () => zoomBy(1 / 1.25, viewport.clientWidth / 2, height / 2)],
    ["+", "zoom in", () => zoomBy(1.25, viewport.clientWidth / 2, height / 2)],
    ["fit", "fit the whole graph", fit],
    ["1:1", "actual size", () => { view.scale = 1; view.tx = 0; view.ty = 0; apply(); }],
  ]) {
    const button = html("button", { type: "button", title: label, "aria-label": label }, zoom, text);
    button.addEventListener("click", act);
  }
  viewport.addEventListener("wheel", (ev) => {
    if (!ev.ctrlKey && !ev.metaKey) return; // a plain wheel scrolls the page
    ev.preventDefault();
    const box = viewport.getBoundingClientRect();
    zoomBy(ev.deltaY < 0 ? 1.15 : 1 / 1.15, ev.clientX - box.left, ev.clientY - box.top);
  }, { passive: false });
  // a drag pans; it starts only past a few pixels, so a click still reaches a node
  let press = null;
  let drag = null;
  viewport.addEventListener("pointerdown", (ev) => {
    if (ev.button === 0) press = { id: ev.pointerId, x: ev.clientX, y: ev.clientY };
  });
  viewport.addEventListener("pointermove", (ev) => {
    if (press && !drag && Math.hypot(ev.clientX - press.x, ev.clientY - press.y) > 4) {
      drag = { x: press.x - view.tx, y: press.y - view.ty };
      viewport.classList.add("dragging");
      viewport.setPointerCapture(press.id);
    }
    if (!drag) return;
    view.tx = ev.clientX - drag.x;
    view.ty = ev.clientY - drag.y;
    apply();
  });
  const stop = () => { press = null; drag = null; viewport.classList.remove("dragging"); };
  viewport.addEventListener("pointerup", stop);
  viewport.addEventListener("pointercancel", stop);
  start();
  container.__agGraph = { key: layoutKey(graph), nodes, edges };
}

/** Re-colours the graph drawn by renderGraph in place (states, attempts, loop
 * progress, routes taken), keeping the zoom; draws it anew if its layout changed. */
export function updateGraph(container, graph) {
  const drawn = container.__agGraph;
  if (!drawn || drawn.key !== layoutKey(graph)) {
    renderGraph(container, graph);
    return;
  }
  for (const node of graph.nodes) {
    const parts = drawn.nodes.get(node.id);
    if (parts) paintNode(parts, node);
  }
  graph.edges.forEach((edge, i) => {
    const pair = drawn.edges[i];
    if (pair) pair[1].classList.toggle("taken", Boolean(edge.taken));
  });
}
