"""The tool kinds, one module each: `run(tool, args, limit, cancel, resources)` returns the
call's result as JSON text (see `actors.tools.executors` for what each kind does)."""
