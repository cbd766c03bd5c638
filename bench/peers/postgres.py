"""A throwaway PostgreSQL cluster for a bench: the tests' own (tests/support/postgres.py),
one copy of the initdb / pg_ctl code.

    pg = await Postgres.start(synchronous_commit=True)
    url = pg.url("dbos_bench")           # postgresql+psycopg://... for SQLAlchemy
    pg.pid                               # the postmaster (its children: checkpointer, backends, ...)
    await pg.stop()
"""

from __future__ import annotations

from tests.support.postgres import BIN, Postgres, available

__all__ = ["BIN", "Postgres", "available"]
