"""The bearer-token and body-size middleware, driven as plain ASGI callables."""

from __future__ import annotations

import asyncio
from typing import Any

from api.app import BearerAuthMiddleware, BodyLimitMiddleware


async def echo(scope: dict, receive: Any, send: Any) -> None:
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def call(app: Any, path: str = "/x", headers=(), chunks=(b"",)) -> tuple[int, bytes, dict]:
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(msg: dict) -> None:
        sent.append(msg)

    scope = {"type": "http", "path": path, "headers": [(k, v) for k, v in headers]}
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], body, dict(start.get("headers") or [])


def test_bearer_token():
    app = BearerAuthMiddleware(echo, "tok")
    assert call(app)[0] == 401
    assert call(app, headers=[(b"authorization", b"Bearer tok")])[0] == 200
    assert call(app, headers=[(b"authorization", b"bearer   tok")])[0] == 200
    for bad in (b"Bearer tok2", b"Bearer to", b"Basic tok", b"Bearer", b"tok", b"Bearer \xff"):
        status, _, headers = call(app, headers=[(b"authorization", bad)])
        assert status == 401, bad
        assert headers[b"www-authenticate"] == b"Bearer"
    assert call(app, path="/healthz")[0] == 200
    closed = BearerAuthMiddleware(echo, "tok", open_paths=frozenset())
    assert call(closed, path="/healthz")[0] == 401


def test_lifespan_passes_through_auth():
    seen = []

    async def inner(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(BearerAuthMiddleware(inner, "tok")({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_body_limit():
    app = BodyLimitMiddleware(echo, max_bytes=10)
    assert call(app, chunks=(b"0123456789",))[:2] == (200, b"0123456789")
    assert call(app, chunks=(b"01234", b"56789"))[:2] == (200, b"0123456789")
    assert call(app, chunks=(b"0123456", b"7890"))[0] == 413
    assert call(app, headers=[(b"content-length", b"11")], chunks=(b"",))[0] == 413
    assert call(app, headers=[(b"content-length", b"x")])[0] == 400
