"""What the execution page's graph and timeline cost the UI server, per playbook size.

    python -m bench.ui_graph [--sizes 20,200,1000] [--repeat 5]

Pure (no NATS): playbooks of N steps made like tests/support/graph.py's `big_playbook`
(a chain, every tenth step starting a side branch of ten, every chain step with
`on_failure: cleanup`, some with retries), a completed run of each made by the engine's
own fold (tests/harness), then, medians over `--repeat` runs, in ms:
* `parse`: the baseline, `load_playbook` of the source: what the server does anyway to
  know a version's steps;
* `layout`: `playbook_graph` with its cache emptied: the layout, once per playbook
  version;
* `update`: `execution_graph` over the run's whole log, the layout cached: what each live
  update of the page costs;
* `timeline`: `step_timeline` over the same log;
* `graph_kb`, `timeline_kb`: the JSON sent to the page, and `yaml_kb` the source's size.
Ratios: each time over `parse` at the same size. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from actors.client.logview import LogItem
from actors.playbook.loader import load_playbook
from actors.ui import graph as graph_module
from actors.ui.graph import execution_graph, playbook_graph
from actors.ui.timeline import step_timeline
from tests.harness import Harness
from tests.support.graph import big_playbook


def median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def measure(steps: int, repeat: int) -> dict[str, Any]:
    source = big_playbook(main=steps // 2, every=10, side=10)
    playbook = load_playbook(source)
    run = Harness().run(source)
    items = [LogItem(i.seq, i.at, i.cls, i.type, i.step, dict(i.data)) for i in run.items]

    def fresh_layout() -> None:
        graph_module._cache.clear()
        playbook_graph(playbook)

    parse = median_ms(lambda: load_playbook(source), repeat)
    layout = median_ms(fresh_layout, repeat)
    playbook_graph(playbook)  # cached from here on
    update = median_ms(lambda: execution_graph(playbook, items, {}), repeat)
    timeline = median_ms(lambda: step_timeline(items), repeat)
    graph_json = json.dumps(execution_graph(playbook, items, {}), separators=(",", ":"))
    timeline_json = json.dumps(step_timeline(items), separators=(",", ":"))
    return {
        "steps": len(playbook.workflow),
        "log_items": len(items),
        "parse_ms": parse,
        "layout_ms": layout,
        "update_ms": update,
        "timeline_ms": timeline,
        "layout_over_parse": round(layout / parse, 2),
        "update_over_parse": round(update / parse, 2),
        "timeline_over_parse": round(timeline / parse, 2),
        "yaml_kb": round(len(source) / 1024, 1),
        "graph_kb": round(len(graph_json) / 1024, 1),
        "timeline_kb": round(len(timeline_json) / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="20,200,1000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results = [measure(int(n), args.repeat) for n in args.sizes.split(",")]
    for r in results:
        print(
            f"{r['steps']:>5} steps: parse {r['parse_ms']} ms, layout {r['layout_ms']} ms "
            f"({r['layout_over_parse']}x), update {r['update_ms']} ms ({r['update_over_parse']}x), "
            f"timeline {r['timeline_ms']} ms ({r['timeline_over_parse']}x); graph {r['graph_kb']} kB, "
            f"timeline {r['timeline_kb']} kB, yaml {r['yaml_kb']} kB",
            file=sys.stderr,
        )
    print(json.dumps({"bench": "ui_graph", "results": results}))


if __name__ == "__main__":
    main()
