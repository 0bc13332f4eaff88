"""Who may call a server this toolkit starts (``heart serve``, ``heart mcp serve --transport
http``): anyone on this machine when it listens on loopback; off loopback, only a client that
presents the server's API key, as vLLM's ``--api-key`` does (``Authorization: Bearer KEY``
on every request, 401 otherwise).

    key = api_key_for(args.host, args.api_key, "heart serve")   # UserError off loopback without one
    app = RequireKey(app, key) if key else app                  # any ASGI app (FastAPI, MCP's Starlette)
"""

from __future__ import annotations

import hmac
import json
import os
from typing import Any, Awaitable, Callable

from heart.user_errors import UserError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""Bind addresses only this machine reaches."""

API_KEY_ENV = "HEART_API_KEY"
"""The environment variable that stands in for ``--api-key`` (a key kept out of ``ps``)."""


def api_key_for(host: str, api_key: str | None, command: str) -> str | None:
    """The key a server bound to ``host`` requires (``--api-key``, else :data:`API_KEY_ENV`);
    None on loopback without one. UserError when ``host`` is not loopback and no key is set:
    a server reachable from other machines would run anyone's requests on this one."""
    key = api_key or os.environ.get(API_KEY_ENV) or None
    if key is None and host not in LOOPBACK:
        raise UserError(f"{command}: --host {host} is reachable from other machines and the server has no key: "
                        f"pass --api-key KEY (or set {API_KEY_ENV}); clients then send 'Authorization: Bearer KEY'. "
                        f"Loopback ({', '.join(LOOPBACK)}) needs none")
    return key


class RequireKey:
    """ASGI middleware: an HTTP request without ``Authorization: Bearer <key>`` gets 401 in
    the OpenAI error shape; lifespan and other scopes pass through untouched."""

    def __init__(self, app: Callable[..., Awaitable[None]], key: str):
        self.app = app
        self._expected = f"Bearer {key}".encode()

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if hmac.compare_digest(given, self._expected):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": {"message": "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                     "type": "authentication_error", "param": None, "code": "invalid_api_key"}})
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body.encode()})
