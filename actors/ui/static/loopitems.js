// A loop step's failed items, for the step panel (steppanel.js calls
// window.renderLoopItems(container, executionId, stepName) for a loop node): how many
// failed, a page of them (index, attempts, error, element) from
// /api/executions/{id}/items (actors/ui/items.py), the next page, and a "Redrive failed
// items" button that asks first, then POSTs /api/executions/{id}/redrive and links the
// new execution. Every value is set as text (an element or an error is a user's value).
import { api, config, configReady, el, execLink, post } from "/static/app.js";

const PAGE = 20; // items a page shows

function elementText(item) {
  if (item.element_head !== undefined) return `${item.element_head}…`;
  return JSON.stringify(item.element);
}

export async function renderLoopItems(container, executionId, stepName) {
  const id = encodeURIComponent(executionId);
  const count = el("div", { class: "li-count", text: "loading failed items…" });
  const tbody = el("tbody");
  const table = el("table", { class: "li-items", hidden: true },
    el("thead", {}, el("tr", {}, ...["#", "attempts", "error", "element"].map((h) => el("th", { text: h })))),
    tbody);
  const next = el("button", { class: "li-next", text: "Next page", hidden: true });
  const redrive = el("button", { class: "li-redrive danger", text: "Redrive failed items", hidden: true });
  const ask = el("div", { class: "li-ask", hidden: true });
  const confirmBtn = el("button", { class: "li-confirm primary", text: "Redrive" });
  const keep = el("button", { class: "li-keep", text: "Keep" });
  const said = el("div", { class: "li-said" });
  container.replaceChildren(count, table, el("div", { class: "li-actions" }, next, redrive), ask, said);

  let after = null;
  let total = 0;
  let shown = 0;
  const load = async () => {
    const p = new URLSearchParams({ failed: "1", limit: String(PAGE) });
    if (stepName) p.set("step", stepName);
    if (after) p.set("after", after);
    const page = await api(`/api/executions/${id}/items?${p}`);
    total = page.total;
    // pages follow the order the items failed (not their indices): say which of them these are
    const from = shown + 1;
    shown += page.items.length;
    count.textContent = total
      ? `${total.toLocaleString()} failed item${total === 1 ? "" : "s"}` +
        (page.items.length < total ? ` · showing ${from}–${shown}, in the order they failed` : "")
      : "no failed items";
    tbody.replaceChildren(...page.items.map((it) => {
      const error = el("td", { class: "li-error" }, el("span", { class: "mono", text: it.error.type }), `: ${it.error.message}`);
      if (it.error.traceback) error.append(el("details", {}, el("summary", { text: "traceback" }), el("pre", { text: it.error.traceback })));
      return el("tr", { "data-index": it.index },
        el("td", { class: "mono", text: it.index }),
        el("td", { text: it.attempts }),
        error,
        el("td", {}, el("code", { text: elementText(it) })));
    }));
    table.hidden = !page.items.length;
    after = page.next_after;
    next.hidden = !after;
    await configReady.catch(() => {});
    redrive.hidden = !total || config.read_only;
  };

  next.addEventListener("click", () => load().catch((e) => { said.textContent = e.message; }));
  redrive.addEventListener("click", () => {
    ask.replaceChildren(
      el("span", { text: `Run the ${total.toLocaleString()} failed item${total === 1 ? "" : "s"} of ${stepName || "its loops"} again, in a new execution that keeps every other item's result? ` }),
      confirmBtn, " ", keep);
    ask.hidden = false;
    redrive.disabled = true;
  });
  keep.addEventListener("click", () => {
    ask.hidden = true;
    redrive.disabled = false;
  });
  confirmBtn.addEventListener("click", async () => {
    confirmBtn.disabled = true;
    try {
      const r = await post(`/api/executions/${id}/redrive`, { step: stepName || null });
      ask.hidden = true;
      said.replaceChildren(
        el("span", { text: r.existing ? "this redrive was started before: " : "redrive started: " }),
        execLink(r.execution_id));
      said.classList.add("ok");
    } catch (e) {
      said.textContent = e.message;
      redrive.disabled = false;
    }
    confirmBtn.disabled = false;
  });

  try {
    await load();
  } catch (e) {
    count.textContent = `failed items: ${e.message}`;
  }
}

window.renderLoopItems = renderLoopItems;
