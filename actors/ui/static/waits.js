// What a running execution waits for, on its page (a box under its facts): each wait's
// step, signal, key, since when and until when (the status's `waiting`, from its
// `execution.waiting` events). A waiting approval step (`approval: true`) gets Approve
// and Reject with a comment box, sent to /api/executions/{id}/approval (actors/ui/signals.py,
// `Client.approve`) unless the UI is read-only. app.js hands every update of the page
// over as the "execution-update" event. Every value goes in as textContent, never as markup.

const BOX_ID = "waits";

function el(name, attrs = {}, ...children) {
  const node = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = String(v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function when(t) {
  if (t === null || t === undefined) return "-";
  return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function waitText(w) {
  let text;
  if (w.signal === null || w.signal === undefined) text = `until ${when(w.deadline)}`;
  else {
    text = `${w.approval ? "approval" : "signal"} ${w.signal}`;
    if (w.key) text += ` key ${JSON.stringify(w.key)}`;
    if (w.loop) text += " (one per item)";
  }
  text += ` since ${when(w.since)}`;
  if (w.signal && w.deadline) text += `, times out ${when(w.deadline)}`;
  return text;
}

async function send(id, body) {
  const headers = { "Content-Type": "application/json" };
  const token = localStorage.getItem("actors-ui-token");
  if (token) headers["X-Actors-Token"] = token;
  const res = await fetch(`/api/executions/${encodeURIComponent(id)}/approval`, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
  });
  const answer = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(answer.error || `${res.status} ${res.statusText}`);
  return answer;
}

function say(message, ok) {
  const f = document.getElementById("flash");
  if (!f) return;
  f.textContent = message;
  f.className = ok ? "ok" : "";
  f.hidden = !message;
}

function approvalForm(id, w) {
  const comment = el("input", { class: "approval-comment", placeholder: "comment (required to reject)", size: 32, maxlength: 1000 });
  const approve = el("button", { class: "approve", text: "Approve" });
  const reject = el("button", { class: "danger reject", text: "Reject" });
  const answer = async (approved) => {
    const text = comment.value.trim();
    if (!approved && !text) {
      say("a rejection needs a comment: say why");
      comment.focus();
      return;
    }
    approve.disabled = reject.disabled = true;
    try {
      const r = await send(id, { step: w.step, approved, comment: text });
      // a duplicate: the wait had an answer already (someone else's, first), and it stands
      if (!r.accepted) say(`not sent: the execution is ${r.state}`, false);
      else if (r.duplicate) say("already answered: someone answered this step first; yours was not sent", false);
      else say(approved ? "approved" : "rejected", true);
    } catch (e) {
      say(e.message);
      approve.disabled = reject.disabled = false;
    }
  };
  approve.addEventListener("click", () => answer(true));
  reject.addEventListener("click", () => answer(false));
  return el("div", { class: "actions approval" }, comment, approve, reject);
}

function render(box, id, waits, readOnly) {
  box.replaceChildren(el("h2", { text: "Waiting" }));
  for (const w of waits) {
    const row = el("div", { class: "wait", "data-step": w.step },
      el("span", { class: "wait-step mono", text: w.step }), " ",
      el("span", { class: "wait-what", text: waitText(w) }));
    if (w.approval && !w.loop && !readOnly) row.append(approvalForm(id, w));
    box.append(row);
  }
}

document.addEventListener("execution-update", (e) => {
  const { id, detail, readOnly } = e.detail;
  const waits = (detail.status && detail.status.waiting) || [];
  let box = document.getElementById(BOX_ID);
  if (!box) {
    const links = document.getElementById("links");
    if (!links) return;
    box = el("div", { class: "panel waits", id: BOX_ID, hidden: true });
    links.parentNode.insertBefore(box, links);
  }
  // drawn again only when the waits change: a comment being typed is kept across updates
  const shape = JSON.stringify([id, waits.map((w) => [w.step, w.activation, w.since, w.signal, w.key, w.deadline])]);
  if (box.dataset.shape === shape) return;
  box.dataset.shape = shape;
  box.hidden = !waits.length;
  if (waits.length) render(box, id, waits, readOnly);
  else box.replaceChildren();
});
