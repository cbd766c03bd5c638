"""The web UI: the server and pages (actors/ui/server.py, static/), and the pure models
the execution page draws: the playbook as a graph (graph.py, laid out by layout.py,
coloured from the log by runstate.py) and the step timeline (timeline.py)."""
