"""Peer bench: ours against DBOS and Temporal, run by `python -m bench.peers` (see __main__.py)."""
