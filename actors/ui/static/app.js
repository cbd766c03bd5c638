// The web UI's pages: executions (/), one execution (/executions/<id>), the catalog
// (/playbooks) and one playbook (/playbooks/<name>). One shell, routed here; live
// through server-sent events. Every value from the server is set with textContent or
// setAttribute, never parsed as HTML: a payload or an error message is only text.
import { renderGraph, updateGraph } from "/static/graph.js";
import { renderTimeline } from "/static/timeline.js";
import { schedulesPage } from "/static/schedules.js";
import { triggersPage } from "/static/triggers.js";
import { deadLettersPage } from "/static/deadletters.js";

const STATES = ["PENDING", "RUNNING", "HALTED", "COMPLETED", "FAILED", "CANCELLED"];
const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED"]);
const main = document.getElementById("main");
let config = { read_only: true, token_required: false };
let streams = []; // EventSources of the page shown; closed when it changes

// --- helpers ------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = String(v);
    else if (k === "on") for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

function badge(state) {
  return el("span", { class: "badge state", "data-state": state, text: state });
}

function time(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function clock(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  return d.toTimeString().slice(0, 8) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function duration(a, b) {
  if (!a) return "";
  const s = (b || Date.now() / 1000) - a;
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${Math.floor(s / 60)} m ${Math.round(s % 60)} s`;
  return `${(s / 3600).toFixed(1)} h`;
}

function flash(message, ok) {
  const f = document.getElementById("flash");
  f.textContent = message;
  f.className = ok ? "ok" : "";
  f.hidden = !message;
}

async function api(path, options) {
  const res = await fetch(path, options);
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(body.error || `${res.status} ${res.statusText}`), { status: res.status, body });
  return body;
}

async function post(path, body) {
  const headers = { "Content-Type": "application/json" };
  const token = localStorage.getItem("actors-ui-token");
  if (token) headers["X-Actors-Token"] = token;
  return api(path, { method: "POST", headers, body: JSON.stringify(body || {}) });
}

function live(url, handlers) {
  const es = new EventSource(url);
  const dot = document.getElementById("live");
  es.onopen = () => dot.classList.add("on");
  es.onerror = () => dot.classList.remove("on");
  for (const [event, fn] of Object.entries(handlers)) es.addEventListener(event, (e) => fn(JSON.parse(e.data)));
  streams.push(es);
  return es;
}

function link(href, text, attrs) {
  return el("a", { href, text, ...(attrs || {}) });
}

function execLink(id) {
  return link(`/executions/${encodeURIComponent(id)}`, id, { class: "mono" });
}

// --- routing ------------------------------------------------------------------------

// state: { wait: true } for a page of an execution just started (its start may be queued)
function navigate(href, state) {
  history.pushState(state || {}, "", href);
  route();
}

document.addEventListener("click", (e) => {
  const a = e.target.closest && e.target.closest("a[href^='/']");
  if (!a || e.ctrlKey || e.metaKey || e.shiftKey || a.target) return;
  e.preventDefault();
  navigate(a.getAttribute("href"));
});
window.addEventListener("popstate", route);

function route() {
  for (const es of streams) es.close();
  streams = [];
  flash("");
  document.getElementById("live").classList.remove("on");
  const path = decodeURIComponent(location.pathname);
  const section = path.startsWith("/playbooks") ? "playbooks"
    : path === "/schedules" || path === "/triggers" || path === "/deadletters" ? path.slice(1) : "executions";
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === section);
  main.replaceChildren();
  const show = (p) => p.catch((err) => flash(String(err.message || err)));
  if (path.startsWith("/executions/")) return show(executionPage(path.slice("/executions/".length)));
  if (path === "/playbooks") return show(playbooksPage());
  if (path.startsWith("/playbooks/")) return show(playbookPage(path.slice("/playbooks/".length)));
  if (path === "/schedules") return show(schedulesPage(main));
  if (path === "/triggers") return show(triggersPage(main));
  if (path === "/deadletters") return show(deadLettersPage(main));
  return show(executionsPage());
}

// --- executions -----------------------------------------------------------------------

// a status's error (type, message, step) in one line
function errorLine(error) {
  if (!error) return "";
  const message = String(error.message || "").replace(/\n/g, " ");
  return `${error.type || "Error"}: ${message}${error.step ? ` (step '${error.step}')` : ""}`;
}

// a RUNNING execution's waits (`tool: wait`): what it waits for, shown beside its state
function waitingTag(waits) {
  const what = waits.map((w) =>
    w.signal ? `${w.approval ? "approval" : "signal"} ${w.signal} (step ${w.step})` : `a date (step ${w.step})`,
  );
  return el("span", { class: "waiting-tag", text: "waiting", title: `waiting for ${what.join(", ")}` });
}

function execRow(r) {
  const tr = el(
    "tr",
    { "data-id": r.execution_id, "data-state": r.state },
    el("td", {}, execLink(r.execution_id)),
    el("td", {}, r.playbook ? link(`/playbooks/${r.playbook}`, r.playbook) : ""),
    el("td", { class: "num", text: r.version ?? "" }),
    el("td", {}, badge(r.state), ...(r.waiting && r.waiting.length ? [" ", waitingTag(r.waiting)] : [])),
    el("td", { text: time(r.started_at) }),
    el("td", { class: "num", text: duration(r.started_at, r.ended_at) }),
    el("td", { class: "err", text: errorLine(r.error), title: errorLine(r.error) }),
  );
  return tr;
}

async function executionsPage() {
  const params = new URLSearchParams(location.search);
  const state = el("select", { name: "state", "aria-label": "state" }, el("option", { value: "", text: "any state" }));
  for (const s of STATES) state.append(el("option", { value: s, text: s, selected: params.get("state") === s }));
  const playbook = el("input", { name: "playbook", placeholder: "playbook", value: params.get("playbook") || "", list: "pb-names" });
  const q = el("input", { name: "q", placeholder: "search id", value: params.get("q") || "", type: "search" });
  const names = el("datalist", { id: "pb-names" });
  const apply = () => {
    const p = new URLSearchParams();
    for (const [k, input] of [["state", state], ["playbook", playbook], ["q", q]]) if (input.value) p.set(k, input.value);
    navigate(`/${p.toString() ? "?" + p : ""}`);
  };
  state.addEventListener("change", apply);
  for (const i of [playbook, q]) i.addEventListener("keydown", (e) => e.key === "Enter" && apply());
  const tbody = el("tbody", { id: "executions" });
  const more = el("button", { id: "more", text: "More", hidden: true });
  main.append(
    el("h1", { text: "Executions" }),
    el("div", { class: "filters" }, state, playbook, q, names, el("button", { text: "Filter", on: { click: apply } })),
    el(
      "table",
      { class: "executions" },
      el(
        "thead",
        {},
        el("tr", {}, ...["id", "playbook", "v", "state", "started", "duration", "error"].map((h) => el("th", { text: h }))),
      ),
      tbody,
    ),
    el("div", { class: "more" }, more),
  );
  const filters = new URLSearchParams();
  for (const k of ["state", "playbook", "q"]) if (params.get(k)) filters.set(k, params.get(k));
  // live first, so that nothing that changes while the first page loads is missed
  live(`/api/executions/stream?${filters}`, {
    status: (r) => {
      const old = tbody.querySelector(`tr[data-id="${CSS.escape(r.execution_id)}"]`);
      if (old) old.replaceWith(execRow(r));
      else tbody.prepend(execRow(r));
    },
  });
  let next = null;
  const load = async () => {
    const p = new URLSearchParams(filters);
    p.set("limit", "50");
    if (next) p.set("before", String(next));
    const page = await api(`/api/executions?${p}`);
    for (const r of page.executions) if (!tbody.querySelector(`tr[data-id="${CSS.escape(r.execution_id)}"]`)) tbody.append(execRow(r));
    next = page.next;
    more.hidden = !next;
    if (!tbody.children.length && !next) tbody.append(el("tr", { class: "empty" }, el("td", { colspan: 7, class: "muted", text: "no executions" })));
  };
  more.addEventListener("click", () => load().catch((e) => flash(e.message)));
  await load();
  // the playbook filter's suggestions, once the rows are shown
  api("/api/playbooks").then((c) => names.append(...c.playbooks.map((p) => el("option", { value: p.path }))));
}

// --- one execution ----------------------------------------------------------------------

async function executionPage(id) {
  await configReady;
  const title = el("h1", {}, el("span", { class: "mono", id: "exec-id", text: id }), el("span", { id: "exec-state" }));
  const facts = el("dl", { class: "grid kv panel", id: "facts" });
  const actions = el("div", { class: "actions", id: "actions" });
  const links = el("div", { class: "links", id: "links" });
  const error = el("div", { id: "error" });
  const graph = el("div", { class: "graph panel", id: "graph" });
  const loops = el("div", { id: "loops" });
  const timeline = el("div", { class: "timeline panel", id: "timeline" });
  const result = el("div", { id: "result" });
  const logs = el("div", { id: "logs" });
  const events = el("div", { id: "events" });
  // what an execution has: hidden until it exists (an id not found shows no empty sections)
  const sections = el("div", { id: "exec-sections" },
    el("div", { class: "exec-grid" },
      el("div", {}, el("h2", { text: "Graph" }), graph, loops, el("h2", { text: "Timeline" }), timeline),
      el("div", {}, error, result)),
    el("h2", { text: "Step logs" }), logs,
    el("h2", { text: "Events" }), events);
  main.append(
    title,
    el("div", { class: "bar-line" }, facts, actions),
    links,
    sections);

  const cancel = el("button", { class: "danger", id: "cancel", text: "Cancel", hidden: true });
  const retry = el("button", { id: "retry", text: "Retry", hidden: true });
  if (!config.read_only) actions.append(cancel, retry);
  // a cancel asks first, with a reason (kept in the log and shown in the status); an
  // inline form, not window.confirm: it says what happens and takes the reason
  const reason = el("input", { id: "cancel-reason", placeholder: "reason (shown in its status)", size: 32, maxlength: 1000 });
  const confirmCancel = el("button", { class: "danger", id: "cancel-confirm", text: "Cancel execution" });
  const keep = el("button", { id: "cancel-keep", text: "Keep running" });
  const ask = el("div", { class: "panel confirm", id: "cancel-ask", hidden: true },
    el("div", { text: "Cancel this execution? Its running steps are stopped; it ends CANCELLED." }),
    el("div", { class: "actions" }, reason, confirmCancel, keep));
  if (!config.read_only) main.insertBefore(ask, links);
  cancel.addEventListener("click", () => {
    ask.hidden = false;
    cancel.disabled = true;
    reason.focus();
  });
  keep.addEventListener("click", () => {
    ask.hidden = true;
    cancel.disabled = false;
  });
  const sendCancel = async () => {
    confirmCancel.disabled = true;
    try {
      await post(`/api/executions/${encodeURIComponent(id)}/cancel`, { reason: reason.value.trim() || null });
      ask.hidden = true;
      flash("cancel sent", true);
    } catch (e) {
      flash(e.message);
      cancel.disabled = false;
    }
    confirmCancel.disabled = false;
  };
  confirmCancel.addEventListener("click", sendCancel);
  reason.addEventListener("keydown", (e) => e.key === "Enter" && sendCancel());
  retry.addEventListener("click", async () => {
    try {
      const r = await post(`/api/executions/${encodeURIComponent(id)}/retry`, { from: null, payload: null });
      navigate(`/executions/${encodeURIComponent(r.execution_id)}`, { wait: true });
    } catch (e) {
      flash(e.message);
    }
  });

  let drawn = null; // the node ids of the graph drawn, to re-colour it in place
  let finished = false;
  const show = (d) => {
    const s = d.status;
    document.getElementById("exec-state").replaceChildren(badge(s.state));
    title.setAttribute("data-state", s.state);
    const fact = (k, v) => [el("div", {}, el("dt", { text: k }), el("dd", {}, v ?? ""))];
    facts.replaceChildren(
      ...fact("playbook", d.playbook_path ? link(`/playbooks/${d.playbook_path}`, d.playbook_path) : ""),
      ...fact("version", String(d.playbook_version ?? "")),
      ...fact("started", time(s.started_at)),
      ...fact("ended", time(s.ended_at)),
      ...fact("duration", duration(s.started_at, s.ended_at)),
    );
    cancel.hidden = TERMINAL.has(s.state);
    if (TERMINAL.has(s.state)) ask.hidden = true;
    retry.hidden = !(s.state === "FAILED" || s.state === "CANCELLED");
    const rel = [];
    if (d.parent) rel.push(el("span", {}, "parent ", execLink(d.parent.execution_id)));
    for (const c of d.children) rel.push(el("span", { "data-child": c }, "child ", execLink(c)));
    if (d.retry_of) rel.push(el("span", {}, "retry of ", execLink(d.retry_of.execution_id)));
    for (const r of d.retried_by) rel.push(el("span", { "data-retry": r }, "retried by ", execLink(r)));
    links.replaceChildren(...rel);
    showError(error, d.error);
    if (d.graph) {
      const ids = d.graph.nodes.map((n) => n.id).join("\n");
      if (drawn === ids) updateGraph(graph, d.graph);
      else renderGraph(graph, d.graph);
      drawn = ids;
      showLoops(loops, d.graph.nodes.filter((n) => n.loop));
    } else graph.replaceChildren(el("span", { class: "muted", text: "no graph: the playbook did not load" }));
    renderTimeline(timeline, d.timeline);
    result.replaceChildren();
    if (s.state === "COMPLETED") {
      const text = d.result_ref
        ? `too large for the page: \`actors-cli result ${id}\` prints it`
        : d.result_truncated ? d.result : JSON.stringify(d.result, null, 2);
      result.append(el("h2", { text: d.result_truncated ? "Result (cut: see actors-cli result)" : "Result" }),
        el("pre", { id: "result-json", text }));
    }
    // what it waits for, and an approval step's buttons (waits.js)
    document.dispatchEvent(new CustomEvent("execution-update", { detail: { id, detail: d, readOnly: config.read_only } }));
    if (TERMINAL.has(s.state) && !finished) {
      finished = true;
      loadLogs(id, logs);
      loadEvents(id, events);
    } else if (!TERMINAL.has(s.state)) liveLogs();
  };
  // while it runs, what its steps print so far (their parts come as the log grows): read
  // again at most once a second, never while the last read is still under way (a slow
  // server is not asked again and again), the last change never left unread
  let logsAt = 0;
  let logsTimer = null;
  let logsBusy = false;
  let logsAgain = false;
  const liveLogs = () => {
    if (logsBusy) { logsAgain = true; return; }
    if (logsTimer !== null || finished) return;
    logsTimer = setTimeout(async () => {
      logsTimer = null;
      logsAt = Date.now();
      if (finished) return;
      logsBusy = true;
      try {
        await loadLogs(id, logs, true);
      } finally {
        logsBusy = false;
      }
      if (logsAgain) { logsAgain = false; liveLogs(); }
    }, Math.max(0, logsAt + 1000 - Date.now()));
  };
  let known = true;
  const waiting = (message) => {
    document.getElementById("exec-state").replaceChildren(badge("PENDING"));
    flash(`${message}: waiting for it to start`, true);
  };
  try {
    show(await api(`/api/executions/${encodeURIComponent(id)}`));
  } catch (e) {
    if (e.status !== 404) throw e;
    known = false;
    sections.hidden = true;
    if ((history.state && history.state.wait) || (e.body && e.body.queued)) {
      waiting(e.message); // just started, or its start still queued: the stream below shows it once it exists
    } else {
      // an id that names nothing (a typo, a link to a retired execution) says so; it is
      // waited for only when asked
      document.getElementById("exec-state").replaceChildren(badge("NOT FOUND"));
      title.setAttribute("data-state", "NOT FOUND");
      flash(e.message);
      const wait = el("button", { id: "wait", text: "Wait for it to start" });
      actions.replaceChildren(wait);
      wait.addEventListener("click", () => {
        history.replaceState({ ...(history.state || {}), wait: true }, "");
        route(); // the same page, waiting
      });
      return;
    }
  }
  if (known && !finished) {
    loadLogs(id, logs);
    loadEvents(id, events);
  }
  live(`/api/executions/${encodeURIComponent(id)}/stream`, {
    update: (d) => {
      if (!known) {
        known = true;
        sections.hidden = false;
        flash("");
        if (!finished) loadEvents(id, events);
      }
      show(d);
    },
  });
}

function showError(box, error) {
  box.replaceChildren();
  if (!error) return;
  const panel = el("div", { class: "panel error-box" });
  const root = error.root_cause;
  if (root) {
    panel.append(el("div", {}, el("span", { class: "type", text: `${root.type || "Error"}: ` }),
      el("span", { id: "error-message", text: root.message || "" })));
    const where = [];
    if (root.step) where.push(`step ${root.step}`);
    if (root.failed_steps && root.failed_steps.length) where.push(`failed steps: ${root.failed_steps.join(", ")}`);
    if (where.length) panel.append(el("div", { class: "muted", text: where.join("; ") }));
  }
  if (error.envelope) {
    const env = error.envelope;
    const err = env.error || {};
    panel.append(el("h3", { text: `Remediated: step ${env.step} failed` }),
      el("div", {}, el("span", { class: "type", text: `${err.type || "Error"}: ` }), el("span", { text: err.message || "" })),
      el("details", {}, el("summary", { text: "failure envelope handed to the remediation step" }),
        el("pre", { class: "light", id: "envelope", text: env.text || "" })));
  }
  if (root && root.type === "Cancelled") panel.classList.add("cancelled-box");
  box.append(el("h2", { text: root ? (root.type === "Cancelled" ? "Cancelled" : "Failure") : "Handled failure" }), panel);
}

function showLoops(box, nodes) {
  box.replaceChildren();
  if (!nodes.length) return;
  const rows = nodes.map((n) => {
    const l = n.loop;
    const pct = l.total ? Math.min(100, (100 * l.done) / l.total) : 0;
    const fill = el("span");
    fill.style.width = `${pct}%`;
    return el("tr", { "data-loop": n.id, "data-done": l.done, "data-total": l.total ?? "" },
      el("td", { text: n.id }),
      el("td", {}, el("div", { class: `bar ${l.failed ? "failed" : n.state}` }, fill)),
      el("td", { class: "num loop-count", text: `${l.done.toLocaleString()} / ${l.total === null ? "?" : l.total.toLocaleString()}` }),
      el("td", { class: "num", text: l.rate ? `${Math.round(l.rate).toLocaleString()}/s` : "" }),
      el("td", { class: "num", text: l.in_flight }),
      el("td", { class: "num", text: l.failed }),
      el("td", {}, badge(n.state.toUpperCase())));
  });
  box.append(el("h2", { text: "Loops" }), el("table", {},
    el("thead", {}, el("tr", {}, ...["step", "progress", "done / total", "rate", "in flight", "failed", "state"]
      .map((h) => el("th", { text: h })))), el("tbody", {}, ...rows)));
}

// `live`: a poll while it runs (the server reads no stored object for it); the server
// sends the first 200 outputs, each cut, and how many there are
async function loadLogs(id, box, live = false) {
  try {
    const { logs, total } = await api(`/api/executions/${encodeURIComponent(id)}/logs${live ? "?live=1" : ""}`);
    box.replaceChildren();
    if (!logs.length) return box.append(el("div", { class: "muted", text: "nothing printed" }));
    if (total > logs.length) {
      box.append(el("div", { class: "muted", id: "logs-more",
        text: `the first ${logs.length} of ${total} outputs: actors-cli logs ${id} prints them all` }));
    }
    for (const l of logs) {
      const what = `${l.step}${l.iteration_index !== null ? ` [${l.iteration_index}]` : ""} · attempt ${l.attempt_number}${l.running ? " · running" : ""}`;
      box.append(el("div", { class: "muted mono", text: what }),
        el("pre", { class: "light", "data-log-step": l.step, "data-log-running": l.running ? "1" : "0", text: l.text }));
    }
  } catch (e) {
    box.replaceChildren(el("div", { class: "muted", text: `logs unavailable: ${e.message}` }));
  }
}

async function loadEvents(id, box) {
  const { events } = await api(`/api/executions/${encodeURIComponent(id)}/events`);
  const rows = events.slice(0, 2000).map((e, i) =>
    el("tr", { "data-type": e.type },
      el("td", { class: "num", text: i + 1 }),
      el("td", { class: "mono", text: clock(e.at), title: time(e.at) }),
      el("td", { class: "mono", text: e.type }),
      el("td", { text: e.step || "" }),
      el("td", {}, el("code", { text: JSON.stringify(e.data).slice(0, 300) }))));
  box.replaceChildren(el("table", { class: "events" },
    el("thead", {}, el("tr", {}, ...["#", "at", "type", "step", "data"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...rows)));
}

// --- playbooks ------------------------------------------------------------------------

async function playbooksPage() {
  const { playbooks } = await api("/api/playbooks");
  const rows = playbooks.map((p) => {
    const last = p.versions[p.versions.length - 1];
    return el("tr", { "data-playbook": p.path },
      el("td", {}, link(`/playbooks/${p.path}`, p.path)),
      el("td", { class: "num", text: last.version }),
      el("td", { text: p.versions.map((v) => v.version).join(", ") }),
      el("td", { text: time(last.registered_at) }),
      el("td", {}, link(`/?playbook=${encodeURIComponent(p.path)}`, "executions")));
  });
  main.append(el("h1", { text: "Playbooks" }), el("table", { class: "playbooks" },
    el("thead", {}, el("tr", {}, ...["playbook", "latest", "versions", "registered", ""].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 5, class: "muted", text: "no playbooks registered: actors-cli register FILE" }))]))));
}

async function playbookPage(name) {
  await configReady;
  const version = new URLSearchParams(location.search).get("version");
  const [pb, catalog] = await Promise.all([
    api(`/api/playbooks/${name}${version ? `?version=${encodeURIComponent(version)}` : ""}`),
    api("/api/playbooks"),
  ]);
  const versions = (catalog.playbooks.find((p) => p.path === pb.path) || { versions: [] }).versions;
  const pick = el("select", { id: "version", "aria-label": "version" });
  for (const v of versions) pick.append(el("option", { value: v.version, text: `version ${v.version}`, selected: v.version === pb.version }));
  pick.addEventListener("change", () => navigate(`/playbooks/${pb.path}?version=${pick.value}`));
  main.append(el("h1", {}, el("span", { id: "playbook-name", text: pb.path }), pick,
    link(`/?playbook=${encodeURIComponent(pb.path)}`, "executions")));
  const yaml = el("pre", { class: "light", id: "yaml", text: pb.source });
  const side = el("div", {});
  if (!config.read_only) {
    const payload = el("textarea", { id: "payload", spellcheck: "false", "aria-label": "payload (JSON)" });
    // the playbook's workload, as the form's starting point: what runs unless changed
    payload.value = JSON.stringify(pb.workload || {}, null, 2);
    const go = el("button", { class: "primary", id: "start", text: `Start version ${pb.version}` });
    go.addEventListener("click", async () => {
      let body;
      try {
        body = JSON.parse(payload.value || "{}");
      } catch (e) {
        return flash(`payload: not JSON (${e.message})`);
      }
      try {
        const r = await post(`/api/playbooks/${pb.path}/start`, { payload: body, version: pb.version });
        navigate(`/executions/${encodeURIComponent(r.execution_id)}`, { wait: true });
      } catch (e) {
        flash(e.message);
      }
    });
    side.append(el("h2", { text: "Start" }), el("div", { class: "panel start-form" },
      el("label", { class: "muted", text: "payload (JSON object, merged over the workload)" }), payload, el("div", {}, go)));
  }
  // its graph as an execution draws it, every step pending (no execution needed), and
  // no loop's runtime figures (done, rate, in flight, failed): there is no run to count
  const graph = el("div", { class: "graph panel", id: "graph" });
  main.append(el("h2", { text: "Graph" }), graph);
  if (pb.graph) {
    renderGraph(graph, { ...pb.graph, nodes: pb.graph.nodes.map(({ loop, ...node }) => node) });
  }
  else graph.append(el("span", { class: "muted", text: "no graph: the playbook did not load" }));
  main.append(el("div", { class: "two" }, el("div", {}, el("h2", { text: "YAML" }), yaml), side));
}

// --- start ----------------------------------------------------------------------------

// the config is asked for at once, beside the first page's data: only the pages with
// buttons wait for it
const configReady = api("/api/config").then((c) => {
  config = c;
  document.getElementById("mode").textContent = config.read_only ? "read-only" : "";
  const box = document.getElementById("token-box");
  box.hidden = !config.token_required;
  const token = document.getElementById("token");
  token.value = localStorage.getItem("actors-ui-token") || "";
  token.addEventListener("change", () => localStorage.setItem("actors-ui-token", token.value));
});
configReady.catch((e) => flash(String(e.message || e)));
// for the pages in modules of their own (schedules.js, deadletters.js)
export { api, badge, config, configReady, el, execLink, flash, link, live, navigate, post };
route();
