"""What a playbook's page shows besides its YAML: its graph, drawn as an execution's
is (actors/ui/graph.py, every node pending) without an execution, and its workload,
which fills the start form. Parsed once per version like an execution's playbook
(`DetailCache`: off the event loop, under the deployment's retry ceiling)."""

from __future__ import annotations

from typing import Any

from actors.client import Client
from actors.ui.detail import DetailCache
from actors.ui.graph import playbook_graph
from actors.wire.messages import CatalogEntry, StartRecord


async def playbook_view(client: Client, cache: DetailCache, entry: CatalogEntry) -> dict[str, Any]:
    """`{"graph", "workload"}`; both null when the source does not load (a catalog
    entry written before a rule it breaks existed): the page shows the YAML alone."""
    # the parse is keyed as an execution's is: one of this version shares it
    record = StartRecord(
        execution_id="-",
        playbook_path=entry.path,
        playbook_version=entry.version,
        playbook_source=entry.source,
        limits=client.limits,
    )
    playbook = await cache.playbook(record)
    if playbook is None:
        return {"graph": None, "workload": None}
    return {"graph": playbook_graph(playbook), "workload": playbook.workload}
