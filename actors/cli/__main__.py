"""`python -m actors.cli`: the same as the `actors-cli` console script."""

from actors.cli.main import entrypoint

entrypoint()
