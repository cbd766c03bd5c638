"""The web UI (`actors-cli ui`): executions live, one execution's graph, timeline, logs
and failure, the playbook catalog; cancel, retry and start. An aiohttp server
(`server.py`) over `actors.client.Client`, and plain ES modules in `static/` shipped
in the wheel (no build step, no library vendored).

* `server`: the app (`make_app`), its JSON API, live feeds (SSE) and guarded actions
* `listing`: the executions page's rows, paged from stream INDEX
* `detail`: one execution's page data (status, graph, timeline, result, failure, links)
* `live`: status changes fanned out to open pages; one execution's changes
* the pure models the execution page draws: the playbook as a graph (`graph`, laid out
  by `layout`, coloured from the log by `runstate`) and the step timeline (`timeline`)
"""
