"""A small paginated JSON API for the pipeline example (stdlib only).

    python -m examples.pipeline.api [--port 8000] [--items 100] [--flaky 5,6]

``GET /items?page=N&pageSize=M`` answers ``{"data": [items], "paging": {"page", "pageSize",
"total", "hasMore"}}``, pages numbered from 1, as the design documents' API does. Each item:
``{"id", "name", "country", "amount_cents"}``, the same on every run. ``--flaky`` names pages
whose first request answers 503 Service Unavailable, as a real API hiccups: the playbook's
retry rule for errors fetches them again.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["COUNTRIES", "items", "pages", "serve"]

COUNTRIES = ("DE", "FR", "JP", "US")


def items(n: int) -> list[dict[str, Any]]:
    """The API's items: the same `n` on every run."""
    return [
        {"id": i, "name": f"item {i}", "country": COUNTRIES[i % len(COUNTRIES)], "amount_cents": (i * 37) % 1000}
        for i in range(1, n + 1)
    ]


def handler(catalogue: list[dict[str, Any]], flaky: Iterable[int] = ()) -> type[BaseHTTPRequestHandler]:
    hiccups = set(flaky)  # pages whose next request fails (once each)
    lock = threading.Lock()

    class Items(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/items":
                self._answer(404, {"error": f"no such path {url.path}"})
                return
            query = parse_qs(url.query)
            try:
                page = int(query.get("page", ["1"])[0])
                size = int(query.get("pageSize", ["10"])[0])
            except ValueError:
                self._answer(400, {"error": "page and pageSize must be whole numbers"})
                return
            if page < 1 or not 1 <= size <= 1000:
                self._answer(400, {"error": "page >= 1 and 1 <= pageSize <= 1000"})
                return
            with lock:
                hiccup = page in hiccups
                hiccups.discard(page)
            if hiccup:
                self._answer(503, {"error": f"page {page}: try again"})
                return
            chunk = catalogue[(page - 1) * size : page * size]
            paging = {"page": page, "pageSize": size, "total": len(catalogue), "hasMore": page * size < len(catalogue)}
            self._answer(200, {"data": chunk, "paging": paging})

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the example prints what matters

    return Items


def serve(
    *, host: str = "127.0.0.1", port: int = 0, n: int = 100, flaky: Iterable[int] = ()
) -> tuple[ThreadingHTTPServer, str]:
    """Serve `n` items in a daemon thread: (the server, to `shutdown()`; its base URL).
    The first request for each page in `flaky` answers 503."""
    server = ThreadingHTTPServer((host, port), handler(items(n), flaky))
    threading.Thread(target=server.serve_forever, name="pipeline-api", daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"


def pages(text: str) -> tuple[int, ...]:
    """`--flaky`'s value: page numbers, comma-separated."""
    return tuple(int(p) for p in text.split(",") if p.strip())


def main() -> None:
    p = argparse.ArgumentParser(description="the pipeline example's paginated API")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--flaky", type=pages, default=(), help="pages whose first request answers 503, e.g. 5,6")
    a = p.parse_args()
    server, url = serve(port=a.port, n=a.items, flaky=a.flaky)
    print(f"serving {a.items} items at {url}/items?page=1&pageSize=10 (Ctrl-C stops)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
