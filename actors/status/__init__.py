"""The status projector: lifecycle events into the status bucket, the only writer of an execution's status."""
