"""Profilers and what-if harnesses: where the time of a bench goes (not figures to
compare against a baseline). Run from the repository: `python -m bench.profile.<name>`."""
