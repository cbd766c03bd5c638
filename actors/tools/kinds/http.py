"""The `http` kind: one request through the actor's shared aiohttp session
(`ToolResources.http_session`), cancelled on timeout or cancel; a `credential` gives it
headers (`credential_headers`)."""

from __future__ import annotations

import base64
from typing import Any

from actors.runtime import tracing
from actors.tools import fields
from actors.tools.call import ToolCall
from actors.tools.failures import ToolFailure, result_json, safe_str
from actors.tools.limits import limited
from actors.tools.redact import REDACTOR
from actors.tools.resources import ToolResources
from actors.wire.jsonvalues import dumps, loads

__all__ = ["credential_headers", "run_http"]

_RETRYABLE_STATUS = frozenset({408, 429})
_QUERY_METHODS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})
_EXCERPT = 200
_HEADER = "header."


async def run_http(call: ToolCall) -> bytes:
    """``{"status", "headers", "data"}``, bounded by the smaller of the call's timeout and the
    tool's own ``timeout``."""
    own, limit = call.tool.get("timeout"), call.limit
    if own is not None:
        own = fields.seconds(own, "http timeout")
        limit = own if limit is None else min(own, limit)
    request = _request(call.tool, call.args, call.resources, call.credential)
    return result_json(await limited(request, limit, call.cancel))


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


def credential_headers(name: str, credential: dict[str, str]) -> dict[str, str]:
    """The headers a credential gives a request: ``token`` as a bearer token, ``username``
    and ``password`` as basic auth (UTF-8), and each ``header.<Name>`` key as header ``<Name>``."""
    headers = {k[len(_HEADER) :]: v for k, v in credential.items() if k.startswith(_HEADER) and len(k) > len(_HEADER)}
    if "token" in credential:
        headers["Authorization"] = f"Bearer {credential['token']}"
    elif "username" in credential or "password" in credential:
        pair = f"{credential.get('username', '')}:{credential.get('password', '')}".encode()
        encoded = base64.b64encode(pair).decode("ascii")
        REDACTOR.add([encoded])  # the encoded pair is as secret as the password
        headers["Authorization"] = f"Basic {encoded}"
    if not headers:
        raise ToolFailure(
            "CredentialInvalid",
            f"credential {name!r} has no key http can use: `token`, `username`/`password` or `header.<Name>`",
        )
    return headers


def _has_userinfo(url: str) -> bool:
    import yarl

    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError):
        return False  # aiohttp says what is wrong with it
    return parsed.user is not None or parsed.password is not None


async def _request(
    tool: dict[str, Any], args: dict[str, Any], resources: ToolResources, credential: dict[str, str] | None
) -> dict[str, Any]:
    import aiohttp

    url = tool.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ToolFailure("ToolConfigError", "http tool needs a `url`")
    method = str(tool.get("method") or "GET").upper()
    params = fields.mapping(tool.get("params"), "http params") or {}
    headers = {
        str(k): str(v) for k, v in (fields.mapping(tool.get("headers"), "http headers") or {}).items() if v is not None
    }
    if credential is not None:  # the credential's headers win over the tool's own
        given = credential_headers(str(tool.get("credential")), credential)
        if "Authorization" in given and _has_userinfo(url):
            raise ToolFailure(
                "ToolConfigError",
                f"credential {tool.get('credential')!r} sets Authorization and the url carries a user: use one",
            )
        lowered = {k.lower() for k in given}
        headers = {k: v for k, v in headers.items() if k.lower() not in lowered} | given
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
        # a client span, its `traceparent` sent to the server (docs/tracing.md): a no-op when tracing is off
        with tracing.http_client(method, url, headers) as span:
            try:
                if credential is None:
                    async with session.request(
                        method, url, params=query or None, headers=headers or None, data=data
                    ) as resp:
                        status, reason, rheaders, raw, charset, content_type = await _response(resp)
                else:
                    status, reason, rheaders, raw, charset, content_type = await _request_with_credential(
                        session, method, url, query, headers, data, secret=frozenset(k.lower() for k in given)
                    )
            except BaseException as exc:
                tracing.fail(span, exc)
                raise
            tracing.responded(span, status)
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
        # masked before it is cut: a cut through a credential the server echoed would leave
        # its start, which the mask (matching whole values only) would no longer find
        excerpt = REDACTOR.text(" ".join(text.split()))[:_EXCERPT]
        msg = f"HTTP {status}{' ' + reason if reason else ''} for {method} {url}" + (f": {excerpt}" if excerpt else "")
        retryable = status in _RETRYABLE_STATUS or status >= 500
        raise ToolFailure("HTTPError", msg, retryable=retryable, status=status, data=result)
    return result


_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10  # aiohttp's own default


async def _response(resp: Any) -> tuple[int, str, dict[str, str], bytes, str, str]:
    raw = await resp.read()
    rheaders: dict[str, str] = {}
    for hk, hv in resp.headers.items():
        k, v = str(hk), str(hv)  # multidict's istr keys are not plain str
        rheaders[k] = f"{rheaders[k]}, {v}" if k in rheaders else v
    return resp.status, resp.reason or "", rheaders, raw, resp.charset or "utf-8", resp.content_type


def _origin(u: Any) -> tuple[str, str | None, int | None]:
    return (u.scheme.lower(), (u.host or "").lower(), u.port)


async def _request_with_credential(
    session: Any,
    method: str,
    url: str,
    query: dict[str, Any],
    headers: dict[str, str],
    data: bytes | None,
    *,
    secret: frozenset[str],
) -> tuple[int, str, dict[str, str], bytes, str, str]:
    """A request carrying a credential's headers (`secret`, lower-cased names), its redirects
    followed here rather than by aiohttp: aiohttp sends every header again to wherever a
    `Location` points, so a server could send the credential to another origin. Once a
    redirect leaves the first request's origin (scheme, host, port), the credential's headers
    are dropped for the rest of the chain, even back on the first origin (the chain was
    steered by a server that was not the credential's)."""
    import yarl

    params: dict[str, Any] | None = query or None
    first: Any = None
    for _ in range(_MAX_REDIRECTS + 1):
        async with session.request(
            method, url, params=params, headers=headers or None, data=data, allow_redirects=False
        ) as resp:
            location = resp.headers.get("Location")
            if resp.status not in _REDIRECTS or not location:
                return await _response(resp)
            here = resp.url
            if first is None:
                first = here
            target = here.join(yarl.URL(location))
            if target.scheme not in ("http", "https"):
                return await _response(resp)  # not followed: the 3xx is the result
        if _origin(target) != _origin(first):
            headers = {k: v for k, v in headers.items() if k.lower() not in secret}
        # what a client does with the method: 303 asks for a GET; 301 and 302 turn a POST into a
        # GET (every browser, and aiohttp); 307 and 308 repeat the request as it was
        if (resp.status == 303 and method != "HEAD") or (resp.status in (301, 302) and method == "POST"):
            method, data = "GET", None
            headers = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-length")}
        url, params = str(target), None  # the Location is the whole next url, query included
    raise ToolFailure("TooManyRedirects", f"http request to {url}: more than {_MAX_REDIRECTS} redirects")
