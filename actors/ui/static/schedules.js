// The schedules page (/schedules): every schedule with its cron, next and last fire, the
// state of the run its last fire started, and pause, resume, run now and delete. Times
// are UTC. Refreshed every few seconds while shown (a fire, a run's end). Every value
// from the server is set as text, never parsed as HTML.
import { api, badge, config, configReady, el, execLink, flash, link, post } from "/static/app.js";

const REFRESH = 5000; // ms between two reads of the list while the page is shown

// epoch seconds or an RFC 3339 string, in UTC to the second: 2026-11-26 21:04:05Z
export function utc(t) {
  if (t === null || t === undefined || t === "") return "";
  const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  return d.toISOString().slice(0, 19).replace("T", " ") + "Z";
}

// "in 42 s", "3 m ago": how far a time is from now
export function relative(t) {
  if (t === null || t === undefined) return "";
  const at = typeof t === "number" ? t * 1000 : Date.parse(t);
  if (Number.isNaN(at)) return "";
  const s = Math.round((at - Date.now()) / 1000);
  const a = Math.abs(s);
  if (a < 2) return "just now";
  const span = a < 120 ? `${a} s` : a < 7200 ? `${Math.round(a / 60)} m` : a < 172800 ? `${Math.round(a / 3600)} h` : `${Math.round(a / 86400)} d`;
  return s >= 0 ? `in ${span}` : `${span} ago`;
}

// an id for one click of "run now": the same click sent twice starts one execution
function requestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export async function schedulesPage(main) {
  await configReady;
  const tbody = el("tbody", { id: "schedules" });
  const started = el("div", { class: "links", id: "run-started" });
  main.append(
    el("h1", { text: "Schedules" }),
    el("div", { class: "muted hint", text: "times in UTC · add one with actors-cli schedule add NAME --playbook P --cron \"*/5 * * * *\"" }),
    started,
    el("table", { class: "schedules" },
      el("thead", {}, el("tr", {}, ...["schedule", "playbook", "cron", "state", "next fire", "last fire", "last run", ""]
        .map((h) => el("th", { text: h })))),
      tbody));

  const requests = new Map(); // schedule -> the id of its next "run now" click
  const act = async (name, verb, button, body) => {
    button.disabled = true;
    try {
      const r = await post(`/api/schedules/${encodeURIComponent(name)}/${verb}`, body || {});
      if (verb === "run") {
        requests.delete(name); // the next click is another run
        started.replaceChildren(el("span", {}, `${name}: started `, execLink(r.execution_id)));
        flash(`schedule ${name}: run started`, true);
      } else flash(`schedule ${name}: ${verb === "delete" ? "deleted" : r.changed ? `${verb}d` : `already ${verb === "pause" ? "paused" : "active"}`}`, true);
      await load();
    } catch (e) {
      flash(e.message);
    }
    button.disabled = false;
  };

  const row = (s) => {
    const state = s.paused ? "PAUSED" : "ACTIVE";
    const actions = el("td", { class: "row-actions" });
    if (!config.read_only) {
      const toggle = el("button", { "data-action": s.paused ? "resume" : "pause", text: s.paused ? "Resume" : "Pause" });
      toggle.addEventListener("click", () => act(s.name, s.paused ? "resume" : "pause", toggle));
      const run = el("button", { class: "primary", "data-action": "run", text: "Run now" });
      run.addEventListener("click", () => {
        if (!requests.has(s.name)) requests.set(s.name, requestId());
        act(s.name, "run", run, { request: requests.get(s.name) });
      });
      const del = el("button", { class: "danger", "data-action": "delete", text: "Delete" });
      del.addEventListener("click", () => {
        // asks once more in place: a schedule deleted is gone (its executions stay)
        if (del.dataset.armed) return act(s.name, "delete", del);
        del.dataset.armed = "1";
        del.textContent = "Delete for good?";
        setTimeout(() => { delete del.dataset.armed; del.textContent = "Delete"; }, 4000);
      });
      actions.append(toggle, run, del);
    }
    const last = s.last_execution_id
      ? el("span", { class: "last-run" }, s.last_state ? badge(s.last_state) : "", " ", execLink(s.last_execution_id))
      : el("span", { class: "muted", text: "never fired" });
    return el("tr", { "data-schedule": s.name, "data-state": state, "data-last-state": s.last_state || "" },
      el("td", { class: "mono", text: s.name }),
      el("td", {}, link(`/playbooks/${s.playbook}`, s.playbook), s.version !== null ? el("span", { class: "muted", text: ` v${s.version}` }) : ""),
      el("td", {}, el("code", { text: s.cron }), el("div", { class: "muted", text: s.timezone })),
      el("td", {}, el("span", { class: "badge state", "data-state": state, text: state.toLowerCase() })),
      el("td", { class: "next-fire", title: s.next_fire || "" }, s.paused ? el("span", { class: "muted", text: "paused" })
        : s.next_fire ? el("span", {}, utc(s.next_fire), el("div", { class: "muted", text: relative(s.next_fire) }))
        : el("span", { class: "muted", text: "unknown", title: "a pattern the next tick cannot be computed from; NATS announces it with each fire" })),
      el("td", { class: "last-fire" }, s.last_fire ? el("span", {}, utc(s.last_fire),
        el("div", { class: "muted", text: `${relative(s.last_fire)}${s.last_run_now ? " · run now" : ""}` })) : el("span", { class: "muted", text: "-" })),
      el("td", {}, last),
      actions);
  };

  const load = async () => {
    const { schedules } = await api("/api/schedules");
    tbody.replaceChildren(...(schedules.length ? schedules.map(row)
      : [el("tr", { class: "empty" }, el("td", { colspan: 8, class: "muted", text: "no schedules" }))]));
  };
  await load();
  // while the page is shown: a fire, a run's end, a change made elsewhere
  const timer = setInterval(() => {
    if (!tbody.isConnected) return clearInterval(timer);
    if (tbody.querySelector("[data-armed], button:disabled")) return; // a click is under way
    load().catch(() => {});
  }, REFRESH);
}
