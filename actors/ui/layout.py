"""A layered left-to-right layout of a directed graph, for drawing a playbook.

The classic pipeline (Sugiyama's), kept small and deterministic, so the page only draws:
1. cycles are broken by reversing the back edges of a depth-first search from the
   nodes in their given order (a playbook's entry first);
2. each node's layer is its longest path from a source; `last` (the playbook's `end`)
   gets a layer of its own after every other node, where the branches join;
3. an edge spanning several layers passes through a virtual node in each layer between,
   so it is routed around the nodes rather than through them;
4. the order within each layer starts from a breadth-first walk and is improved by a
   few barycenter sweeps (each node moved to the mean position of its neighbours in the
   layer before, or after), each followed by swaps of neighbours that remove crossings,
   keeping the order with the fewest edge crossings;
5. each layer is a column; within it a node's centre is pulled towards its neighbours'
   (the least-squares placement that keeps the order and the gaps: isotonic regression
   by pool-adjacent-violators), which straightens chains and long edges.

Only floats, ints and the given order decide anything, so the same graph always gets
the same drawing. Sizes are in SVG user units (px); a node's position is its top-left
corner.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

LAYER_GAP = 110.0  # horizontal room between two columns, for edges and their labels
NODE_GAP = 28.0  # vertical room between two nodes of a column
VIRTUAL_GAP = 14.0  # between an edge's bend point and its neighbours in a column
MARGIN = 24.0
SWEEPS = 6  # barycenter sweeps (down and up each); more rarely improves a playbook
TRANSPOSE_PASSES = 4
PLACEMENT_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Box:
    """A node to place: its id and size."""

    id: str
    w: float
    h: float


@dataclass(slots=True)
class Placed:
    """The layout: each node's top-left corner, each edge's points (from its source's
    side to its target's, in the direction given), the drawing's size. An edge that
    joins a bundle's line on its way names the edge drawing that line in `merges`
    (its points then end where it joins)."""

    positions: dict[str, tuple[float, float]]
    points: list[list[tuple[float, float]]]
    merges: list[int | None]
    layers: dict[str, int]
    width: float
    height: float
    crossings: int = 0


@dataclass(slots=True)
class _Vertex:
    key: int
    w: float
    h: float
    real: str | None  # None: a bend point of a long edge
    layer: int = 0
    preds: list[int] = field(default_factory=list)
    succs: list[int] = field(default_factory=list)
    y: float = 0.0  # centre


def layered_layout(
    boxes: Sequence[Box],
    edges: Sequence[tuple[str, str]],
    *,
    last: str | None = None,
    bundles: Sequence[str | None] | None = None,
) -> Placed:
    """Lay `boxes` out in columns, left to right along `edges` (pairs of box ids; a
    self-loop or an edge to an unknown id is not routed: its points are empty).
    Long edges into one target with the same `bundles` key (one per edge; None: its
    own route) share their bend points from the layer where they meet: twenty steps
    with `on_failure: cleanup` make one line into cleanup, not twenty side by side. The
    line is drawn once, by the edge that starts furthest back (its `trunk`); the others
    end where they join it, so the points sent grow with the edges, not their square."""
    index = {b.id: i for i, b in enumerate(boxes)}
    verts = [_Vertex(i, b.w, b.h, b.id) for i, b in enumerate(boxes)]
    dag, flipped = _acyclic(len(boxes), [(index.get(s, -1), index.get(t, -1)) for s, t in edges], index.get(last or ""))
    _assign_layers(verts, dag, index.get(last or ""))
    chains = _split_long_edges(verts, dag, flipped, bundles or [None] * len(edges))
    layers = _initial_order(verts)
    crossings = _reduce_crossings(verts, layers)
    _place(verts, layers)
    xs, width = _columns(verts, layers)
    top = min((v.y - v.h / 2 for v in verts), default=MARGIN) - MARGIN
    height = max((v.y + v.h / 2 for v in verts), default=0.0) - top + MARGIN

    def left(v: _Vertex) -> float:
        return xs[v.layer] - v.w / 2

    positions = {v.real: (left(v), v.y - v.h / 2 - top) for v in verts if v.real is not None}
    keys = bundles or [None] * len(edges)
    trunks: dict[tuple[int, str], int] = {}  # (target, bundle) -> the edge whose chain is longest
    for e, chain in enumerate(chains):
        key = keys[e]
        if chain is not None and key is not None and e not in flipped and len(chain) > 2:
            best = trunks.setdefault((chain[-1], key), e)
            if len(chain) > len(chains[best] or ()):
                trunks[(chain[-1], key)] = e
    points: list[list[tuple[float, float]]] = []
    merges: list[int | None] = []
    for e, chain in enumerate(chains):
        if chain is None:
            points.append([])
            merges.append(None)
            continue
        path = [(left(verts[chain[0]]) + verts[chain[0]].w, verts[chain[0]].y - top)]
        path += [(xs[verts[k].layer], verts[k].y - top) for k in chain[1:-1]]
        path.append((left(verts[chain[-1]]), verts[chain[-1]].y - top))
        key = keys[e]
        trunk = trunks.get((chain[-1], key)) if key is not None and e not in flipped else None
        if trunk is not None and trunk != e and len(chain) > 2:
            path = path[:2]  # to the bend where it joins the trunk's line
            merges.append(trunk)
        else:
            merges.append(None)
        points.append(path[::-1] if e in flipped else path)
    return Placed(
        positions=positions,
        points=points,
        merges=merges,
        layers={v.real: v.layer for v in verts if v.real is not None},
        width=width,
        height=height,
        crossings=crossings,
    )


def _acyclic(n: int, edges: list[tuple[int, int]], last: int | None) -> tuple[list[tuple[int, int] | None], set[int]]:
    """Each edge as it runs in the layered drawing (a back edge reversed; None for a
    self-loop or an unknown end), and which were reversed. An edge into `last` is never
    a back edge: `last` is drawn after everything."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for e, (s, t) in enumerate(edges):
        if s >= 0 and t >= 0 and s != t and s != last:
            out[s].append((t, e))
    state = [0] * n  # 0 new, 1 on the stack, 2 done
    back: set[int] = set()
    for root in range(n):
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, 0)]
        while stack:  # iterative: a chain of 10,000 steps must not hit the recursion limit
            v, i = stack[-1]
            if i < len(out[v]):
                stack[-1] = (v, i + 1)
                t, e = out[v][i]
                if state[t] == 1:
                    back.add(e)
                elif state[t] == 0:
                    state[t] = 1
                    stack.append((t, 0))
            else:
                state[v] = 2
                stack.pop()
    dag: list[tuple[int, int] | None] = []
    for e, (s, t) in enumerate(edges):
        if s < 0 or t < 0 or s == t:
            dag.append(None)
        elif e in back or s == last:
            dag.append((t, s))
        else:
            dag.append((s, t))
    return dag, back | {e for e, (s, _) in enumerate(edges) if s == last and s >= 0}


def _assign_layers(verts: list[_Vertex], dag: list[tuple[int, int] | None], last: int | None) -> None:
    """Longest path from the sources, in a topological order (Kahn's, ties by index)."""
    n = len(verts)
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for edge in dag:
        if edge is not None:
            succ[edge[0]].append(edge[1])
            indeg[edge[1]] += 1
    ready = [v for v in range(n) if indeg[v] == 0]
    ready.reverse()  # a stack popped from the end: lowest index first
    while ready:
        v = ready.pop()
        for t in succ[v]:
            verts[t].layer = max(verts[t].layer, verts[v].layer + 1)
            indeg[t] -= 1
            if indeg[t] == 0:
                ready.append(t)
    if last is not None and n > 1:
        verts[last].layer = max(v.layer for v in verts if v.key != last) + 1


def _split_long_edges(
    verts: list[_Vertex], dag: list[tuple[int, int] | None], flipped: set[int], bundles: Sequence[str | None]
) -> list[list[int] | None]:
    """Each edge as the chain of vertices it passes, a virtual one per layer crossed
    (shared, within a bundle, with the other edges into the same target)."""
    chains: list[list[int] | None] = []
    seen: dict[tuple[int, int], list[int]] = {}
    shared: dict[tuple[int, str, int], int] = {}  # (target, bundle, layer) -> bend point
    linked: set[tuple[int, int]] = set()
    for e, edge in enumerate(dag):
        if edge is None:
            chains.append(None)
            continue
        if edge in seen:  # a second edge between the same two nodes shares the route
            chains.append(seen[edge])
            continue
        s, t = edge
        bundle = None if e in flipped else bundles[e]
        chain = [s]
        for layer in range(verts[s].layer + 1, verts[t].layer):
            key = None if bundle is None else (t, bundle, layer)
            bend = shared.get(key) if key is not None else None
            if bend is None:
                bend = len(verts)
                verts.append(_Vertex(bend, 0.0, 0.0, None, layer))
                if key is not None:
                    shared[key] = bend
            chain.append(bend)
        chain.append(t)
        for a, b in itertools.pairwise(chain):
            if (a, b) not in linked:
                linked.add((a, b))
                verts[a].succs.append(b)
                verts[b].preds.append(a)
        seen[edge] = chain
        chains.append(chain)
    return chains


def _initial_order(verts: list[_Vertex]) -> list[list[int]]:
    """Columns in depth-first order from the sources (given order first): a branch's
    steps come together, so a tree of branches starts out drawn without crossings."""
    depth = max((v.layer for v in verts), default=0)
    layers: list[list[int]] = [[] for _ in range(depth + 1)]
    seen = [False] * len(verts)
    for root in sorted(verts, key=lambda v: (v.layer, v.key)):
        if seen[root.key] or root.preds:
            continue
        seen[root.key] = True
        stack = [root.key]
        while stack:  # iterative: a chain of 10,000 steps must not hit the recursion limit
            v = stack.pop()
            layers[verts[v].layer].append(v)
            for t in reversed(verts[v].succs):
                if not seen[t]:
                    seen[t] = True
                    stack.append(t)
    for vert in verts:  # only on a cycle no source reaches (cannot happen after _acyclic)
        if not seen[vert.key]:
            layers[vert.layer].append(vert.key)
    return layers


def _reduce_crossings(verts: list[_Vertex], layers: list[list[int]]) -> int:
    pos = [0] * len(verts)

    def number() -> None:
        for layer in layers:
            for i, v in enumerate(layer):
                pos[v] = i

    preds = [v.preds for v in verts]
    succs = [v.succs for v in verts]

    def sweep(rank: range, near: list[list[int]]) -> None:
        for r in rank:
            order = layers[r]
            keys = {}
            for i, v in enumerate(order):
                around = near[v]
                keys[v] = sum(pos[u] for u in around) / len(around) if around else float(i)
            order.sort(key=keys.__getitem__)  # stable: ties keep their order
            for i, v in enumerate(order):
                pos[v] = i

    def cost(u: int, v: int) -> int:
        """Crossings between u's edges and v's when u is above v."""
        pu, pv, su, sv = preds[u], preds[v], succs[u], succs[v]
        return sum(pos[a] > pos[b] for a in pu for b in pv) + sum(pos[a] > pos[b] for a in su for b in sv)

    def transpose() -> None:
        """Swap neighbours in a column while that removes crossings (dot's heuristic)."""
        for _ in range(TRANSPOSE_PASSES):
            improved = False
            for order in layers:
                for i in range(len(order) - 1):
                    u, v = order[i], order[i + 1]
                    if cost(v, u) < cost(u, v):
                        order[i], order[i + 1] = v, u
                        pos[u], pos[v] = i + 1, i
                        improved = True
            if not improved:
                return

    number()
    best = _crossings(verts, layers, pos)
    best_order = [list(layer) for layer in layers]
    for _ in range(SWEEPS):
        if best == 0:
            break
        sweep(range(1, len(layers)), preds)
        sweep(range(len(layers) - 2, -1, -1), succs)
        transpose()
        count = _crossings(verts, layers, pos)
        if count < best:
            best, best_order = count, [list(layer) for layer in layers]
    layers[:] = best_order
    return best


def _crossings(verts: list[_Vertex], layers: list[list[int]], pos: list[int]) -> int:
    """Edge crossings between adjacent columns: inversions of the edges' target
    positions once sorted by source position (counted with a Fenwick tree)."""
    total = 0
    for layer in layers[:-1]:
        targets = [
            pos[t] for v in sorted(layer, key=lambda v: pos[v]) for t in sorted(verts[v].succs, key=pos.__getitem__)
        ]
        size = max(targets, default=0) + 2
        tree = [0] * size
        for seen, p in enumerate(targets):
            i, below = p + 1, 0
            while i > 0:
                below += tree[i]
                i -= i & -i
            total += seen - below  # earlier edges ending further down cross this one
            i = p + 1
            while i < size:
                tree[i] += 1
                i += i & -i
    return total


def _gap(a: _Vertex, b: _Vertex) -> float:
    gap = NODE_GAP if a.real is not None and b.real is not None else VIRTUAL_GAP
    return a.h / 2 + gap + b.h / 2


def _place(verts: list[_Vertex], layers: list[list[int]]) -> None:
    """Vertical centres: stacked, then pulled towards the neighbours' centres."""
    ys = [0.0] * len(verts)
    offsets = []  # per layer: each vertex's least distance below the layer's first
    for layer in layers:
        off = [0.0]
        for a, b in itertools.pairwise(layer):
            off.append(off[-1] + _gap(verts[a], verts[b]))
        offsets.append(off)
        for v, o in zip(layer, off, strict=True):
            ys[v] = o - off[-1] / 2
    preds = [v.preds for v in verts]
    succs = [v.succs for v in verts]
    for round_ in range(PLACEMENT_ROUNDS):
        down = round_ % 2 == 0
        for r in range(1, len(layers)) if down else range(len(layers) - 2, -1, -1):
            _align(ys, layers[r], offsets[r], preds if down else succs)
    both = [p + s for p, s in zip(preds, succs, strict=True)]
    for r, layer in enumerate(layers):  # finally both sides at once: a node between its neighbours
        _align(ys, layer, offsets[r], both)
    for vert, y in zip(verts, ys, strict=True):
        vert.y = y


def _align(ys: list[float], layer: list[int], offsets: list[float], near: list[list[int]]) -> None:
    """Move the layer's vertices as close as they may to the mean of their neighbours."""
    # minimise sum (y_i - desired_i)^2 with y_{i+1} - y_i >= gap_i: with y_i = e_i + offset_i
    # that is an isotonic regression of (desired_i - offset_i), solved by pool-adjacent-violators
    means: list[float] = []
    counts: list[int] = []
    for v, off in zip(layer, offsets, strict=True):
        around = near[v]
        desired = sum(ys[u] for u in around) / len(around) if around else ys[v]
        mean, count = desired - off, 1
        while means and means[-1] > mean:
            m1, c1 = means.pop(), counts.pop()
            mean, count = (m1 * c1 + mean * count) / (c1 + count), c1 + count
        means.append(mean)
        counts.append(count)
    i = 0
    for mean, count in zip(means, counts, strict=True):
        for _ in range(count):
            ys[layer[i]] = mean + offsets[i]
            i += 1


def _columns(verts: list[_Vertex], layers: list[list[int]]) -> tuple[list[float], float]:
    """Each column's centre x, and the drawing's width."""
    xs: list[float] = []
    x = MARGIN
    for layer in layers:
        w = max((verts[v].w for v in layer), default=0.0)
        xs.append(x + w / 2)
        x += w + LAYER_GAP
    return xs, x - LAYER_GAP + MARGIN
