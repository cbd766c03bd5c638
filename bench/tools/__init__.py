"""Tools that make documentation (the web UI's screenshots). Run from the repository:
`python -m bench.tools.<name>`."""
