"""One pooled HTTP client per process, shared by every provider call.

The client is created lazily on first use and is safe to share between threads (httpx's
sync client pools connections behind a lock). A forked child (Celery prefork) must not reuse
the parent's sockets, so the reference is dropped in the child right after `fork()`; the
child builds its own pool on its first call. The parent's sockets are not closed from the
child: closing them there would not help the parent and could confuse its TLS sessions.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

from shared.providers.base import HEADER_STAGE, HEADER_VERIFICATION, CallMeta

MAX_CONNECTIONS = 100
MAX_KEEPALIVE_CONNECTIONS = 50
KEEPALIVE_EXPIRY_S = 60.0
CONNECT_TIMEOUT_S = 10.0
USER_AGENT = "llm-council/0.1"

_lock = threading.Lock()
_client: httpx.Client | None = None
_client_pid: int | None = None


@dataclass(frozen=True)
class RequestSpec:
    """A provider request before it is sent: where, which headers, which JSON body."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)


def new_http_client() -> httpx.Client:
    """A client configured like the shared one (for tests or callers that own their pool)."""
    return httpx.Client(
        limits=httpx.Limits(
            max_connections=MAX_CONNECTIONS,
            max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        ),
        timeout=httpx.Timeout(60.0, connect=CONNECT_TIMEOUT_S),
        headers={"User-Agent": USER_AGENT},
        follow_redirects=False,
    )


def get_http_client() -> httpx.Client:
    """The process-wide pooled client, created on first use."""
    global _client, _client_pid
    client = _client
    if client is not None and _client_pid == os.getpid():
        return client
    with _lock:
        if _client is None or _client_pid != os.getpid():
            # A pid mismatch means a fork the hook did not see: start a fresh pool.
            _client = new_http_client()
            _client_pid = os.getpid()
        return _client


def close_http_client() -> None:
    """Close the shared client (at shutdown, or in tests); the next call makes a new one."""
    global _client, _client_pid
    with _lock:
        client, _client, _client_pid = _client, None, None
    if client is not None:
        client.close()


def _reset_after_fork() -> None:
    global _lock, _client, _client_pid
    # The lock may have been held by another thread at fork time: replace it, never wait.
    _lock = threading.Lock()
    _client = None
    _client_pid = None


os.register_at_fork(after_in_child=_reset_after_fork)


def council_headers(meta: CallMeta) -> dict[str, str]:
    """The headers that label a call with its verification and stage."""
    return {HEADER_VERIFICATION: meta.verification_id, HEADER_STAGE: meta.stage.value}
