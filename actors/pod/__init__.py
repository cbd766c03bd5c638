"""A pod's assembly: which roles run (roles), health and readiness, NATS permissions per
role, task dumps."""
