// PLACEHOLDER until engineer "ui-graph"'s branch is merged (it replaces this file):
// draws the graph model of actors/ui/graph.py as SVG. Every text is set with
// textContent, every value with setAttribute: nothing from data is parsed as HTML.
const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function loopText(loop) {
  return `${loop.done}/${loop.total ?? "?"}`;
}

export function renderGraph(container, graph) {
  container.replaceChildren();
  const root = svg("svg", { width: graph.width, height: graph.height, role: "img", "aria-label": "playbook graph" });
  for (const edge of graph.edges) {
    const d = edge.points.map((p, i) => `${i ? "L" : "M"}${p[0]},${p[1]}`).join(" ");
    root.append(svg("path", { d, class: `edge ${edge.kind}`, "data-from": edge.from, "data-to": edge.to }));
  }
  for (const node of graph.nodes) {
    const g = svg("g", { class: `node state-${node.state}`, "data-step": node.id, "data-state": node.state,
      transform: `translate(${node.x},${node.y})` });
    g.append(svg("rect", { class: "box", width: node.w, height: node.h }));
    const label = svg("text", { x: 10, y: 18 });
    label.textContent = node.label;
    const kind = svg("text", { x: 10, y: 34, class: "kind" });
    kind.textContent = node.kind;
    g.append(label, kind);
    if (node.loop) {
      g.append(svg("rect", { class: "track", x: node.w - 80, y: 26, width: 70, height: 6 }));
      g.append(svg("rect", { class: "fill", x: node.w - 80, y: 26, height: 6, width: 0 }));
      const t = svg("text", { x: node.w - 10, y: 18, class: "kind loop-count", "text-anchor": "end" });
      g.append(t);
      setLoop(g, node);
    }
    root.append(g);
  }
  container.append(root);
}

function setLoop(g, node) {
  const fill = g.querySelector("rect.fill");
  const t = g.querySelector("text.loop-count");
  if (!fill || !t || !node.loop) return;
  const total = node.loop.total || 0;
  fill.setAttribute("width", String(total ? (70 * node.loop.done) / total : 0));
  t.textContent = loopText(node.loop);
}

export function updateGraph(container, graph) {
  for (const node of graph.nodes) {
    const g = [...container.querySelectorAll("g.node")].find((e) => e.getAttribute("data-step") === node.id);
    if (!g) return renderGraph(container, graph);
    g.setAttribute("class", `node state-${node.state}`);
    g.setAttribute("data-state", node.state);
    setLoop(g, node);
  }
}
