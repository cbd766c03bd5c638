"""A pod's assembly: which roles run, health, permissions, dead letters, task dumps."""
