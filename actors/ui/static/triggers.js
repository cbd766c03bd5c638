// The triggers page (/triggers): every trigger with its subject (and stream), playbook,
// state, the executions it started, the messages waiting for it and its last error, with
// pause, resume and delete. Times are UTC. Refreshed every few seconds while shown. Every
// value from the server is set as text, never parsed as HTML.
import { api, config, configReady, el, execLink, flash, link, post } from "/static/app.js";
import { relative, utc } from "/static/schedules.js";

const REFRESH = 5000; // ms between two reads of the list while the page is shown

export async function triggersPage(main) {
  await configReady;
  const tbody = el("tbody", { id: "triggers" });
  main.append(
    el("h1", { text: "Triggers" }),
    el("div", { class: "muted hint", text: "times in UTC · add one with actors-cli trigger add NAME --subject S [--stream STREAM] --playbook P" }),
    el("table", { class: "schedules triggers" },
      el("thead", {}, el("tr", {}, ...["trigger", "subject", "playbook", "state", "started", "waiting", "last start", "errors", ""]
        .map((h) => el("th", { text: h })))),
      tbody));

  const act = async (name, verb, button) => {
    button.disabled = true;
    try {
      const r = await post(`/api/triggers/${encodeURIComponent(name)}/${verb}`, {});
      flash(`trigger ${name}: ${verb === "delete" ? (r.changed ? "deleted" : "deleting (a trigger pod removes it)") : r.changed ? `${verb}d` : `already ${verb === "pause" ? "paused" : "active"}`}`, true);
      await load();
    } catch (e) {
      flash(e.message);
    }
    button.disabled = false;
  };

  const deleteButton = (t) => {
    const del = el("button", { class: "danger", "data-action": "delete", text: "Delete" });
    del.addEventListener("click", () => {
      // asks once more in place: a trigger deleted is gone, its consumer too (its executions stay)
      if (del.dataset.armed) return act(t.name, "delete", del);
      del.dataset.armed = "1";
      del.textContent = "Delete for good?";
      setTimeout(() => { delete del.dataset.armed; del.textContent = "Delete"; }, 4000);
    });
    return del;
  };

  // a spec this version cannot read (a newer version's): its name, why, and Delete
  const unreadable = (t) => el("tr", { "data-trigger": t.name, "data-state": "UNREADABLE" },
    el("td", { class: "mono", text: t.name }),
    el("td", { colspan: 7, class: "muted problem", text: t.problem }),
    el("td", { class: "row-actions" }, config.read_only ? "" : deleteButton(t)));

  const row = (t) => {
    if (t.unreadable) return unreadable(t);
    const state = t.deleting ? "DELETING" : t.paused ? "PAUSED" : "ACTIVE";
    const actions = el("td", { class: "row-actions" });
    if (!config.read_only && !t.deleting) {
      const toggle = el("button", { "data-action": t.paused ? "resume" : "pause", text: t.paused ? "Resume" : "Pause" });
      toggle.addEventListener("click", () => act(t.name, t.paused ? "resume" : "pause", toggle));
      actions.append(toggle, deleteButton(t));
    }
    const last = t.last_execution_id
      ? el("span", {}, execLink(t.last_execution_id), el("div", { class: "muted", text: `${utc(t.last_start)} · ${relative(t.last_start)}` }))
      : el("span", { class: "muted", text: "none yet" });
    const errors = t.errors
      ? el("span", { title: t.last_error || "" }, String(t.errors), el("div", { class: "muted last-error", text: t.last_error || "" }))
      : el("span", { class: "muted", text: "0" });
    const waiting = t.problem ? el("span", { class: "muted", text: t.problem })
      : t.waiting === null ? el("span", { class: "muted", text: "-", title: "a core subject: nothing waits (at most once)" })
      : el("span", { text: String(t.waiting) });
    return el("tr", { "data-trigger": t.name, "data-state": state },
      el("td", { class: "mono", text: t.name }),
      el("td", {}, el("code", { text: t.subject }), el("div", { class: "muted", text: t.stream ? `stream ${t.stream}` : "core NATS, at most once" })),
      el("td", {}, link(`/playbooks/${t.playbook}`, t.playbook), t.version !== null ? el("span", { class: "muted", text: ` v${t.version}` }) : ""),
      el("td", {}, el("span", { class: "badge state", "data-state": state, text: state.toLowerCase() })),
      el("td", { class: "started", text: String(t.started) }),
      el("td", { class: "waiting" }, waiting),
      el("td", {}, last),
      el("td", { class: "errors" }, errors),
      actions);
  };

  const load = async () => {
    const { triggers } = await api("/api/triggers");
    tbody.replaceChildren(...(triggers.length ? triggers.map(row)
      : [el("tr", { class: "empty" }, el("td", { colspan: 9, class: "muted", text: "no triggers" }))]));
  };
  await load();
  const timer = setInterval(() => {
    if (!tbody.isConnected) return clearInterval(timer);
    if (tbody.querySelector("[data-armed], button:disabled")) return; // a click is under way
    load().catch(() => {});
  }, REFRESH);
}
