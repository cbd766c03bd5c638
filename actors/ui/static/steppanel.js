// The step panel of the execution page: a graph node clicked (graph.js's "step-select")
// opens a side panel with that step's whole story from /api/executions/{id}/steps/{step}
// (actors/ui/steps.py, what `actors-cli describe ID STEP` prints): args as rendered,
// result, every attempt with its start, end, worker, error and traceback, the retry that
// followed and the on_error decision, the rule that ended it, what it printed. A loop
// step shows done/total/failed, and its failed items through window.renderLoopItems
// when the page has it. A wait step (`tool: wait`, the story's `wait`) says what it
// waits for, since when and until when, or the signal it took (from whom, when) and
// its data as the result. Every value goes in as textContent (a traceback in a <pre>),
// never as markup.

const HEAD = 2000; // characters of a value (args, result, output) shown
const PANEL_ID = "step-panel";

function el(name, attrs = {}, ...children) {
  const node = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = String(v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children) if (c) node.append(c);
  return node;
}

function head(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  if (text === undefined) return "null";
  return text.length <= HEAD ? text : text.slice(0, HEAD - 1) + "…";
}

function when(t) {
  if (t === null || t === undefined) return "-";
  return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.(\d{3})Z$/, ".$1Z");
}

function took(a, b) {
  if (a === null || a === undefined || b === null || b === undefined) return "-";
  const s = Math.max(0, b - a);
  return s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`;
}

/** `flow.yaml:42`: where a python traceback ends in its playbook file, or "". */
export function yamlLine(traceback) {
  const frames = [...String(traceback || "").matchAll(/File "([^"]+)", line (\d+)/g)]
    .filter((m) => /\.ya?ml$/.test(m[1]));
  return frames.length ? `${frames[frames.length - 1][1]}:${frames[frames.length - 1][2]}` : "";
}

function kv(list, key, value) {
  list.append(el("dt", { text: key }), el("dd", { text: value }));
}

function errorBlock(error) {
  const box = el("div", { class: "sp-error" });
  const at = yamlLine(error.traceback);
  box.append(el("div", { class: "sp-error-line", text: `${error.type}: ${error.message}` + (at ? `  at ${at}` : "") }));
  if (error.traceback) box.append(el("pre", { class: "sp-traceback", text: error.traceback }));
  return box;
}

function attemptBlock(a) {
  const box = el("section", { class: "sp-attempt", "data-attempt": a.number });
  box.append(el("h4", { text: `attempt ${a.number} · ${a.state}` }));
  const facts = el("dl", { class: "sp-kv" });
  kv(facts, "started", when(a.started_at));
  kv(facts, "ended", when(a.ended_at));
  kv(facts, "took", took(a.started_at, a.ended_at));
  kv(facts, "worker", a.worker || "-");
  if (a.decision) kv(facts, "on_error", a.decision.decision + (a.decision.rule ? ` (${a.decision.rule})` : ""));
  if (a.retry) kv(facts, "retry", `in ${a.retry.delay} s` + (a.retry.rule ? ` by ${a.retry.rule}` : ""));
  box.append(facts);
  if (a.error) box.append(errorBlock(a.error));
  if (a.output && a.output.size) {
    box.append(el("div", { class: "muted", text: `printed ${a.output.size} bytes` }));
    box.append(el("pre", { class: "sp-output", text: head(a.output.head || "") }));
  }
  return box;
}

/** A wait step's wait in a line: what it waits for (or took, or why it stopped). */
export function waitLine(s) {
  const w = s.wait;
  const got = w.received || null;
  const name = w.signal || (got && got.name);
  const what = name ? `${w.approval ? "approval" : "signal"} ${name}` : "";
  const key = w.key || (got && got.key) || "";
  // a loop of waits renders its key per iteration: the step has none of its own
  const keyed = what + (w.loop_id ? " (a key per iteration)" : key ? ` (key ${key})` : "");
  switch (w.state) {
    case "WAITING":
      if (!what) return `waiting until ${when(w.deadline)}` + (w.since ? ` since ${when(w.since)}` : "");
      return `waiting for ${keyed}` + (w.since ? ` since ${when(w.since)}` : "") +
        (w.deadline ? `, times out ${when(w.deadline)}` : "");
    case "SIGNALLED":
      return `took ${keyed}` + (got.by ? ` from ${got.by}` : "") + ` at ${when(got.at)}` +
        (got.kept ? ` (sent ${when(got.sent_at)}, kept until this step waited)` : "");
    case "TIMED_OUT":
      return `timed out waiting for ${keyed} at ${when(w.ended_at)}` +
        (w.since ? ` (waited since ${when(w.since)})` : "");
    case "UNTIL":
      return `waited until ${when(w.due ?? w.ended_at)}`;
    default: // ENDED: its step ended otherwise (cancelled, aborted), or its loop did
      return `no longer waiting for ${keyed || "its date"}: the step ended ${s.state} at ${when(s.exited_at)}`;
  }
}

function waitBlock(s) {
  const w = s.wait;
  const box = el("section", { class: "sp-wait", "data-state": w.state || "" });
  box.append(el("div", { class: "sp-wait-line", text: waitLine(s) }));
  const got = w.received;
  if (got) {
    const facts = el("dl", { class: "sp-kv" });
    kv(facts, "signal", got.name + (got.key ? ` (key ${got.key})` : ""));
    kv(facts, "from", got.by || "-");
    kv(facts, "sent", when(got.sent_at));
    kv(facts, "taken", when(got.at));
    kv(facts, "signal id", got.signal_id || "-");
    box.append(facts);
  }
  return box;
}

function render(panel, executionId, s) {
  const body = panel.querySelector(".sp-body");
  body.replaceChildren();
  const facts = el("dl", { class: "sp-kv" });
  kv(facts, "state", s.state);
  // a wait that took a kept signal at once, or reached a past date, never waited: the
  // log has no `step.waiting` to name its kind
  kv(facts, "kind", (s.wait && !s.loop ? "wait" : s.kind) || "-");
  kv(facts, "entered", when(s.entered_at));
  kv(facts, "exited", when(s.exited_at));
  kv(facts, "duration", took(s.entered_at, s.exited_at));
  if (s.visits > 1) kv(facts, "visits", String(s.visits));
  if (s.retry_exhausted) {
    const r = s.retry_exhausted;
    kv(facts, "retries", `exhausted after ${r.attempts} attempts (max ${r.max_attempts}, ${r.rule})`);
  }
  const route = s.exit && s.exit.failure_route;
  if (route && route.edge) kv(facts, "on_failure", `${route.edge} -> ${route.target} (${route.status})`);
  body.append(facts);
  if (s.loop) {
    const lp = s.loop;
    body.append(el("div", { class: "sp-loop", text: `loop ${lp.state}: ${lp.done}/${lp.total} done, ${lp.failed} failed` }));
    const items = el("div", { class: "sp-loop-items" });
    body.append(items);
    if (typeof window.renderLoopItems === "function") window.renderLoopItems(items, executionId, s.step);
  }
  if (s.wait) body.append(waitBlock(s));
  if (s.args !== null && s.args !== undefined) body.append(el("h3", { text: "Args" }), el("pre", { text: head(s.args) }));
  // a wait's result is the data of the signal it took (a loop's are its items')
  const tookSignal = Boolean(s.wait && s.wait.received && !s.loop);
  if (s.state === "COMPLETED" && (s.attempts.length || tookSignal)) {
    body.append(el("h3", { text: "Result" }), el("pre", { class: "sp-result", text: head(s.result) }));
  }
  const failedAttempt = s.attempts.some((a) => a.error && s.error && a.error.traceback === s.error.traceback);
  if (s.error && !failedAttempt) body.append(el("h3", { text: "Error" }), errorBlock(s.error));
  if (s.attempts.length) body.append(el("h3", { text: "Attempts" }));
  for (const a of s.attempts) body.append(attemptBlock(a));
}

function panelFor() {
  let panel = document.getElementById(PANEL_ID);
  if (panel) return panel;
  panel = el("aside", { id: PANEL_ID, class: "panel", role: "dialog", "aria-label": "step" });
  const close = el("button", { class: "sp-close", type: "button", "aria-label": "close", text: "×" });
  close.addEventListener("click", () => panel.remove());
  panel.append(el("div", { class: "sp-head" }, el("h2", { class: "sp-title" }), close), el("div", { class: "sp-body" }));
  document.body.append(panel);
  return panel;
}

const STYLE = `
#${PANEL_ID} { position:fixed; top:0; right:0; bottom:0; width:min(44rem, 95vw); overflow:auto; z-index:50;
  background:#fff; border-left:1px solid #cbd5e1; box-shadow:-4px 0 16px rgba(15,23,42,.12); padding:0 1rem 1rem; }
#${PANEL_ID} .sp-head { display:flex; align-items:center; justify-content:space-between; position:sticky; top:0; background:#fff; }
#${PANEL_ID} .sp-close { font-size:1.4rem; background:none; border:none; cursor:pointer; }
#${PANEL_ID} .sp-kv { display:grid; grid-template-columns:max-content 1fr; gap:.15rem .8rem; margin:.4rem 0; }
#${PANEL_ID} .sp-kv dt { color:#64748b; }
#${PANEL_ID} .sp-kv dd { margin:0; }
#${PANEL_ID} pre { white-space:pre-wrap; word-break:break-word; background:#f8fafc; color:#0f172a; padding:.5rem; border-radius:4px; }
#${PANEL_ID} .sp-traceback { background:#fef2f2; }
#${PANEL_ID} .sp-error-line { color:#b91c1c; font-weight:600; }
#${PANEL_ID} .sp-attempt { border-top:1px solid #e2e8f0; margin-top:.5rem; }
#${PANEL_ID} .sp-wait { margin:.5rem 0; padding:.4rem .6rem; border-left:3px solid #d97706; background:#fffbeb; }
#${PANEL_ID} .sp-wait[data-state="SIGNALLED"], #${PANEL_ID} .sp-wait[data-state="UNTIL"] { border-color:#16a34a; background:#f0fdf4; }
#${PANEL_ID} .sp-wait[data-state="TIMED_OUT"] { border-color:#b91c1c; background:#fef2f2; }
#${PANEL_ID} .sp-wait-line { font-weight:600; word-break:break-word; }
`;

async function open(executionId, step) {
  if (!document.getElementById(`${PANEL_ID}-style`)) {
    document.head.append(el("style", { id: `${PANEL_ID}-style`, text: STYLE }));
  }
  const panel = panelFor();
  panel.dataset.step = step;
  panel.querySelector(".sp-title").textContent = step;
  const body = panel.querySelector(".sp-body");
  body.replaceChildren(el("span", { class: "muted", text: "loading…" }));
  let res;
  try {
    res = await fetch(`/api/executions/${encodeURIComponent(executionId)}/steps/${encodeURIComponent(step)}`);
  } catch (e) {
    body.replaceChildren(el("span", { class: "error", text: `could not reach the UI: ${e}` }));
    return;
  }
  const data = await res.json().catch(() => ({}));
  if (panel.dataset.step !== step) return; // another node was clicked meanwhile
  if (!res.ok) {
    body.replaceChildren(el("span", { class: "error", text: data.error || `HTTP ${res.status}` }));
    return;
  }
  render(panel, executionId, data.step);
}

document.addEventListener("step-select", (ev) => {
  const m = location.pathname.match(/^\/executions\/([^/]+)$/);
  if (!m || !ev.detail || !ev.detail.step) return; // a playbook's page: no execution to tell of
  open(decodeURIComponent(m[1]), ev.detail.step);
});
// leaving the execution page (the app routes without reloading) closes the panel
window.addEventListener("popstate", () => document.getElementById(PANEL_ID)?.remove());
