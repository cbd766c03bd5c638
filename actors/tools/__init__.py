"""Tool actors and what they run.

* `actor`: the `ToolActor` (start, stop, commands taken and kept alive)
* `pull`: the continuous pull of one kind's consumer
* `running`: one command, decoded, run (tool and sink) and answered
* `batching`: loop iteration results gathered into one message per loop
* `cancels`: cancels of running and queued commands
* `resources`: the python pool and HTTP session an actor owns
* `executors`: `run_tool`, the table of kinds; `kinds/`: one module per kind
* `failures`: `ToolFailure` and `CancelSignal` (the leaf every other module imports)
* `fields`, `limits`: rendered fields read as what they must be; timeout and cancel
* `pypool`, `pyprocess`, `pyworker`, `cpus`: the python worker pool, one worker seen
  from the pool, what runs inside a worker, the default pool size
* `credentials`, `redact`, `environment`: credentials resolved by name, their values
  (and URL userinfo) masked in what the actor publishes and logs, the clean environment
  python and shell steps start from
"""
