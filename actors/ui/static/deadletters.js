// The dead letters page (/deadletters): what an actor could not handle and why, newest
// first, 50 a page (More reads the page before). Each letter: when (UTC), the actor
// that gave up, why, the execution it is filed under, the subject it came on and the
// head of its message, as text: a letter's bytes are whatever was sent, never markup.
import { api, el, execLink, flash } from "/static/app.js";
import { relative, utc } from "/static/schedules.js";

export async function deadLettersPage(main) {
  const tbody = el("tbody", { id: "letters" });
  const more = el("button", { id: "more", text: "More", hidden: true });
  main.append(
    el("h1", { text: "Dead letters" }),
    el("div", { class: "muted hint", text: "newest first · times in UTC · actors-cli deadletters prints them too" }),
    el("table", { class: "letters" },
      el("thead", {}, el("tr", {}, ...["when", "source", "reason", "execution", "subject", "message"]
        .map((h) => el("th", { text: h })))),
      tbody),
    el("div", { class: "more" }, more));

  const row = (l) => {
    const head = l.size > l.head.length ? `${l.head}…` : l.head;
    return el("tr", { "data-seq": l.seq, "data-source": l.source || "" },
      el("td", { class: "mono when", title: relative(l.at) }, utc(l.at)),
      el("td", {}, el("span", { class: "badge source", text: l.source || "?" })),
      el("td", { class: "reason", text: l.reason }),
      el("td", {}, l.execution_id ? execLink(l.execution_id) : el("span", { class: "muted", text: "-" })),
      el("td", { class: "mono subject", text: l.subject || "" }),
      el("td", { class: "head" }, el("code", { text: head }),
        l.size > l.head.length ? el("div", { class: "muted", text: `first ${l.head.length} of ${l.size.toLocaleString()} characters` }) : ""));
  };

  let next = null;
  const load = async () => {
    const p = new URLSearchParams({ limit: "50" });
    if (next) p.set("before", String(next));
    const page = await api(`/api/deadletters?${p}`);
    tbody.append(...page.letters.map(row));
    next = page.next;
    more.hidden = !next;
    if (!tbody.children.length) tbody.append(el("tr", { class: "empty" }, el("td", { colspan: 6, class: "muted", text: "no dead letters" })));
  };
  more.addEventListener("click", () => load().catch((e) => flash(e.message)));
  await load();
}
