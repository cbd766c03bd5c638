"""The actor kernel every kind of actor runs on: hosting, the log actor, outbox,
ownership, settings, metrics, child processes."""
