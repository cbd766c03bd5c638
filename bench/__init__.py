"""Benchmarks: each prints its figures and, as its last line, one JSON object.
Run from the repository: `python -m bench.<name> --help`. Profilers and what-if
harnesses are in `bench.profile`, tools that make documentation in `bench.tools`;
current figures in bench/RESULTS.md."""
