// PLACEHOLDER until engineer "ui-graph"'s branch is merged (it replaces this file):
// a Gantt of the timeline model of actors/ui/timeline.py, in DOM (textContent only).
export function renderTimeline(container, timeline) {
  container.replaceChildren();
  const start = timeline.start;
  let end = timeline.end ?? Date.now() / 1000;
  for (const row of timeline.rows) for (const b of row.bars) end = Math.max(end, b.end ?? Date.now() / 1000);
  const span = Math.max(end - start, 0.001);
  for (const row of timeline.rows) {
    const r = document.createElement("div");
    r.className = "row";
    r.setAttribute("data-step", row.step);
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = row.step;
    const lane = document.createElement("div");
    lane.className = "lane";
    for (const b of row.bars) {
      const bar = document.createElement("div");
      bar.className = `tbar ${b.kind}`;
      bar.setAttribute("data-attempt", String(b.attempt));
      bar.setAttribute("data-state", b.state);
      bar.style.left = `${(100 * (b.start - start)) / span}%`;
      bar.style.width = `${(100 * ((b.end ?? end) - b.start)) / span}%`;
      bar.title = `${row.step} attempt ${b.attempt}: ${b.state}${b.error ? " — " + b.error : ""}`;
      lane.append(bar);
    }
    r.append(name, lane);
    container.append(r);
  }
}
