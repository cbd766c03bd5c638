"""A pure harness for the engine's semantics: synthetic inputs in, decisions out.

Like a workflow replayer, it drives the pure cores the way their shells do, with no
NATS, no I/O and no sleeps: the engine's `fold` (actors/core/decide.py, as
actors/engine/actor.py calls it) and the counter's `fold_loop` (actors/core/loop.py,
as actors/loops/counter.py calls it). The harness plays every other part itself:
* the log: each input gets a stream sequence and a log time from a synthetic clock,
  which moves only when a durable timer is due (then it jumps to the timer's `due`);
* tool actors: a command is answered by the test's tool function (`Call` in, a result
  out, or `Fail` raised, or `PENDING`: the command runs until it is cancelled, then it
  answers `Cancelled` as a stopped tool does), a chunk answered item by item;
* the counter: a loop handed over becomes a `LoopRun` folded by `fold_loop`, its
  verdict fed back to the execution;
* the starter: `tool: playbook` starts a child execution from the harness's catalog,
  and the child's end goes back to the parent's command; cancels are delivered.

Every touch of the core's API is in this package (`driver`: the shells' part,
`folds`: the folds themselves and replay); tests see a stable view (`view.Run`: status,
result, error, the log as plain `Item`s, the tool calls made), so a change of the
core's types changes this package, not the tests. `replay(run)` folds a run's
recorded inputs again into fresh state and says whether every decision came out the
same (the determinism property), for any run.
"""

from tests.harness.driver import Harness, Stamped
from tests.harness.folds import decisions, log_of, mismatch, refold, replay
from tests.harness.view import PENDING, Call, Fail, Item, Run, Tool

__all__ = [
    "PENDING",
    "Call",
    "Fail",
    "Harness",
    "Item",
    "Run",
    "Stamped",
    "Tool",
    "decisions",
    "log_of",
    "mismatch",
    "refold",
    "replay",
]
