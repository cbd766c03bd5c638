"""The `http` kind: one request through the actor's shared aiohttp session
(`ToolResources.http_session`), cancelled on timeout or cancel."""

from __future__ import annotations

from typing import Any

from actors.jsonvalues import dumps, loads
from actors.tools import fields
from actors.tools.call import ToolCall
from actors.tools.failures import ToolFailure, result_json, safe_str
from actors.tools.limits import limited
from actors.tools.resources import ToolResources

__all__ = ["run_http"]

_RETRYABLE_STATUS = frozenset({408, 429})
_QUERY_METHODS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})
_EXCERPT = 200


async def run_http(call: ToolCall) -> bytes:
    """``{"status", "headers", "data"}``, bounded by the smaller of the call's timeout and the
    tool's own ``timeout``."""
    own, limit = call.tool.get("timeout"), call.limit
    if own is not None:
        own = fields.seconds(own, "http timeout")
        limit = own if limit is None else min(own, limit)
    return result_json(await limited(_request(call.tool, call.args, call.resources), limit, call.cancel))


def _param_value(v: Any) -> str | int | float | list[str | int | float] | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (str, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        out: list[str | int | float] = []
        for x in v:
            px = _param_value(x)
            if isinstance(px, list):
                out.append(fields.text(x))
            elif px is not None:
                out.append(px)
        return out
    return fields.text(v)


def _is_json_type(content_type: str) -> bool:
    ct = content_type.lower()
    return ct == "application/json" or ct.endswith("+json") or ct.endswith("/json")


async def _request(tool: dict[str, Any], args: dict[str, Any], resources: ToolResources) -> dict[str, Any]:
    import aiohttp

    url = tool.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ToolFailure("ToolConfigError", "http tool needs a `url`")
    method = str(tool.get("method") or "GET").upper()
    params = fields.mapping(tool.get("params"), "http params") or {}
    headers = {
        str(k): str(v) for k, v in (fields.mapping(tool.get("headers"), "http headers") or {}).items() if v is not None
    }
    raise_for_status = fields.flag(tool.get("raise_for_status"), "raise_for_status", True)
    json_body = tool.get("json")
    body = tool.get("body")
    if args and json_body is None and body is None:
        if method in _QUERY_METHODS:
            params = {**args, **params}
        else:
            json_body = args

    query: dict[str, Any] = {}
    for k, v in params.items():
        pv = _param_value(v)
        if pv is not None:
            query[str(k)] = pv
    data: bytes | None = None
    if json_body is not None:
        try:
            data = dumps(json_body)
        except TypeError as exc:
            raise ToolFailure("ToolConfigError", f"http json body is not JSON-serialisable: {exc}") from None
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    elif body is not None:
        data = body.encode() if isinstance(body, str) else fields.text(body).encode()

    try:
        session = resources.http_session()
        async with session.request(method, url, params=query or None, headers=headers or None, data=data) as resp:
            raw = await resp.read()
            status = resp.status
            reason = resp.reason or ""
            rheaders: dict[str, str] = {}
            for hk, hv in resp.headers.items():
                k, v = str(hk), str(hv)  # multidict's istr keys are not plain str
                rheaders[k] = f"{rheaders[k]}, {v}" if k in rheaders else v
            charset = resp.charset or "utf-8"
            content_type = resp.content_type
    except aiohttp.InvalidURL as exc:
        raise ToolFailure("ToolConfigError", f"invalid url {url!r}: {exc}") from None
    except TimeoutError:
        raise ToolFailure("Timeout", f"http {method} {url} timed out", retryable=True) from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise ToolFailure(
            "ConnectionError", f"http {method} {url}: {safe_str(exc) or type(exc).__name__}", retryable=True
        ) from None
    except aiohttp.ClientError as exc:
        raise ToolFailure(type(exc).__name__, f"http {method} {url}: {safe_str(exc)}") from None

    try:
        text = raw.decode(charset, errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    payload: Any = text
    if _is_json_type(content_type):
        if not raw.strip():
            payload = None
        else:
            try:
                payload = loads(raw)
            except ValueError:
                payload = text
    result = {"status": status, "headers": rheaders, "data": payload}
    if status >= 400 and raise_for_status:
        excerpt = " ".join(text.split())[:_EXCERPT]
        msg = f"HTTP {status}{' ' + reason if reason else ''} for {method} {url}" + (f": {excerpt}" if excerpt else "")
        retryable = status in _RETRYABLE_STATUS or status >= 500
        raise ToolFailure("HTTPError", msg, retryable=retryable, status=status, data=result)
    return result
