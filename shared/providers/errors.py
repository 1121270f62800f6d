"""Turn provider failures into `ProviderFailure` markers, and decide what is worth a retry.

Kinds: `auth` (401/403), `billing` (402, or a quota/credit error under another status),
`rate_limit` (429), `server` (408/409/5xx), `bad_request` (400/413/422), `not_found` (404),
`connection` (could not connect, connection dropped), `timeout`, `malformed` (a 2xx whose
body we cannot read), `truncated` (output cut off by the token limit), `error` (anything else).

A failure keeps the HTTP status, the provider's error type/code and its message, trimmed
to `MAX_MESSAGE_CHARS`, with our keys redacted; a message that quotes our request is
replaced, so a failure marker never carries the prompt.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from shared.models import ProviderFailure

MAX_MESSAGE_CHARS = 500
RETRYABLE_KINDS = frozenset({"rate_limit", "server", "connection", "timeout"})
#: Statuses that are never retried, whatever the provider's headers say.
NEVER_RETRY_STATUSES = frozenset({400, 401, 402, 403, 404})
NEVER_RETRY_KINDS = frozenset({"auth", "billing"})

#: Phrases that mark a quota/credit failure sent under a non-402 status. Deliberately narrow:
#: OpenAI's ordinary rate-limit text links to its billing page, and must stay a rate limit.
_QUOTA_HINTS = ("insufficient_quota", "exceeded your current quota")
_BILLING_HINTS = (*_QUOTA_HINTS, "insufficient credits", "credit balance", "payment required")
_KEYLIKE = re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_\-*]{6,}")
_BEARER = re.compile(r"(?i)\bbearer\s+\S+")
_QUOTE_WINDOW = 32


#: Error types (Anthropic's and OpenAI's names) for error objects that carry no status.
_TYPE_KINDS = {
    "authentication_error": "auth",
    "permission_error": "auth",
    "billing_error": "billing",
    "insufficient_quota": "billing",
    "rate_limit_error": "rate_limit",
    "overloaded_error": "server",
    "api_error": "server",
    "server_error": "server",
    "timeout_error": "timeout",
    "not_found_error": "not_found",
    "invalid_request_error": "bad_request",
    "request_too_large": "bad_request",
}


def kind_for_status(status: int) -> str:
    """The failure kind an HTTP status (or an in-body error code) stands for."""
    if status in (401, 403):
        return "auth"
    if status == 402:
        return "billing"
    if status == 429:
        return "rate_limit"
    if status in (408, 409) or status >= 500:
        return "server"
    if status in (400, 413, 422):
        return "bad_request"
    if status == 404:
        return "not_found"
    return "error"


def _lower_headers(headers: Mapping[str, str] | httpx.Headers | None) -> dict[str, str]:
    if not headers:
        return {}
    return {str(k).lower(): str(v) for k, v in headers.items()}


def should_retry_header(headers: Mapping[str, str] | httpx.Headers | None) -> bool | None:
    """The provider's `x-should-retry` instruction: True, False or None (not given)."""
    value = _lower_headers(headers).get("x-should-retry", "").strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None


def is_retryable(status: int, headers: Mapping[str, str] | httpx.Headers | None = None) -> bool:
    """Whether a response with this status is worth another attempt.

    `x-should-retry: false` forbids a retry; `x-should-retry: true` forces one, except for
    400/401/402/403/404, which are never retried (another attempt cannot fix them).
    """
    if status in NEVER_RETRY_STATUSES:
        return False
    hint = should_retry_header(headers)
    if hint is not None:
        return hint
    return kind_for_status(status) in RETRYABLE_KINDS


def should_retry(
    failure: ProviderFailure, headers: Mapping[str, str] | httpx.Headers | None = None
) -> bool:
    """Whether to retry after `failure` (kind first, then status and headers)."""
    if failure.kind in NEVER_RETRY_KINDS or failure.status in NEVER_RETRY_STATUSES:
        return False
    hint = should_retry_header(headers)
    if hint is not None:
        return hint
    return failure.kind in RETRYABLE_KINDS


def retry_after_s(
    headers: Mapping[str, str] | httpx.Headers | None, *, now: float | None = None
) -> float | None:
    """Seconds the provider asked us to wait: `retry-after-ms`, then `retry-after`
    (delta-seconds or an HTTP date). None when absent or unreadable."""
    h = _lower_headers(headers)
    raw_ms = h.get("retry-after-ms")
    if raw_ms:
        try:
            ms = float(raw_ms)
        except ValueError:
            ms = -1.0
        if ms >= 0 and math.isfinite(ms):
            return ms / 1000.0
    raw = h.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds)
    if seconds < 0 or not math.isfinite(seconds):
        return None
    return seconds


# Messages ------------------------------------------------------------------------------


def scrub_message(
    message: str, *, secrets: Iterable[str] = (), request_texts: Iterable[str] = ()
) -> str:
    """Trim a provider message, redact keys, and drop it if it quotes our request."""
    text = " ".join(str(message).split())
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = _KEYLIKE.sub(lambda m: f"{m.group(1)}-[redacted]", text)
    text = _BEARER.sub("Bearer [redacted]", text)
    if _quotes_any(text, request_texts):
        return "(provider message omitted: it quoted the request)"
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3].rstrip() + "..."
    return text


def _quotes_any(text: str, request_texts: Iterable[str]) -> bool:
    sources = [t for t in request_texts if t and len(t) >= _QUOTE_WINDOW]
    if not sources or len(text) < _QUOTE_WINDOW:
        return False
    for i in range(0, len(text) - _QUOTE_WINDOW + 1, 4):
        window = text[i : i + _QUOTE_WINDOW]
        if any(window in src for src in sources):
            return True
    return False


def _looks_like_billing(kind: str, *parts: str | None) -> bool:
    blob = " ".join(p for p in parts if p).lower()
    hints = _QUOTA_HINTS if kind == "rate_limit" else _BILLING_HINTS
    return any(hint in blob for hint in hints)


def billing_message(message: str) -> str:
    """Make sure a billing failure reads as one."""
    return message if "billing" in message.lower() else f"billing: {message}".rstrip(": ")


def _code_as_status(code: Any) -> int | None:
    if isinstance(code, bool):
        return None
    if isinstance(code, int) and 100 <= code <= 599:
        return code
    if isinstance(code, str) and code.strip().isdigit():
        value = int(code.strip())
        return value if 100 <= value <= 599 else None
    return None


def _error_fields(error: Any) -> tuple[str | None, Any, str]:
    """(type, code, message) from an error object in any of the shapes we meet."""
    if isinstance(error, str):
        return None, None, error
    if not isinstance(error, Mapping):
        return None, None, ""
    etype = error.get("type")
    code = error.get("code")
    message = error.get("message")
    text = message if isinstance(message, str) else ("" if message is None else str(message))
    metadata = error.get("metadata")
    if isinstance(metadata, Mapping):
        raw = metadata.get("raw")
        if isinstance(raw, str) and raw.strip() and raw.strip() not in text:
            text = f"{text}: {raw.strip()}" if text else raw.strip()
        provider = metadata.get("provider_name")
        if isinstance(provider, str) and provider:
            text = f"{text} (upstream {provider})"
    return (etype if isinstance(etype, str) else None), code, text


def _type_label(etype: str | None, code: Any) -> str | None:
    parts: list[str] = []
    if etype:
        parts.append(etype)
    if isinstance(code, str) and code and not code.strip().isdigit() and code not in parts:
        parts.append(code)
    return "/".join(parts) or None


def _make_failure(
    *,
    kind: str,
    status: int | None,
    etype: str | None,
    code: Any,
    message: str,
    secrets: Iterable[str],
    request_texts: Iterable[str],
) -> ProviderFailure:
    if kind in ("rate_limit", "bad_request", "error") and _looks_like_billing(
        kind, etype, code if isinstance(code, str) else None, message
    ):
        # OpenAI's quota error is a 429 and Anthropic's low-credit error a 400: both are
        # billing problems, not a busy or confused model, and no retry will fix them.
        kind = "billing"
    text = scrub_message(message, secrets=secrets, request_texts=request_texts)
    if kind == "billing":
        text = billing_message(text or "payment required")
    return ProviderFailure(
        kind=kind, status=status, type=_type_label(etype, code), message=text, attempts=1
    )


def failure_from_response(
    status: int,
    body: bytes | str,
    *,
    secrets: Iterable[str] = (),
    request_texts: Iterable[str] = (),
) -> ProviderFailure:
    """Classify a non-2xx response from its status and (OpenAI/Anthropic/OpenRouter) body."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    etype: str | None = None
    code: Any = None
    message = ""
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        data = None
    if isinstance(data, Mapping):
        if "error" in data:
            etype, code, message = _error_fields(data["error"])
        elif isinstance(data.get("message"), str):
            message = data["message"]
            etype = data.get("type") if isinstance(data.get("type"), str) else None
    if not message:
        message = text.strip() if data is None else ""
    if not message:
        message = f"HTTP {status}"
    return _make_failure(
        kind=kind_for_status(status),
        status=status,
        etype=etype,
        code=code,
        message=message,
        secrets=secrets,
        request_texts=request_texts,
    )


def failure_from_error_object(
    error: Any,
    *,
    http_status: int = 200,
    secrets: Iterable[str] = (),
    request_texts: Iterable[str] = (),
) -> ProviderFailure:
    """Classify an error object carried in a 2xx body (OpenRouter style), by its code."""
    etype, code, message = _error_fields(error)
    as_status = _code_as_status(code)
    if as_status is not None:
        kind = kind_for_status(as_status)
        status: int | None = as_status
    else:
        # No numeric code: go by the error type; otherwise the upstream failed mid-way,
        # which is a server error.
        kind = _TYPE_KINDS.get(etype or "", "server")
        status = http_status
    return _make_failure(
        kind=kind,
        status=status,
        etype=etype,
        code=code,
        message=message or "error reported in a successful response",
        secrets=secrets,
        request_texts=request_texts,
    )


def failure_from_exception(exc: BaseException) -> ProviderFailure:
    """Classify a transport error (no response)."""
    if isinstance(exc, httpx.TimeoutException):
        phase = {
            httpx.ConnectTimeout: "connecting",
            httpx.ReadTimeout: "waiting for the response",
            httpx.WriteTimeout: "sending the request",
            httpx.PoolTimeout: "waiting for a pooled connection",
        }.get(type(exc), "waiting")
        return ProviderFailure(kind="timeout", message=f"timed out while {phase}")
    if isinstance(exc, httpx.ConnectError):
        return ProviderFailure(kind="connection", message=f"could not connect: {_exc_text(exc)}")
    if isinstance(exc, httpx.TransportError):
        return ProviderFailure(
            kind="connection", message=f"connection failed: {type(exc).__name__}: {_exc_text(exc)}"
        )
    return ProviderFailure(kind="error", message=f"{type(exc).__name__}: {_exc_text(exc)}")


def _exc_text(exc: BaseException) -> str:
    return scrub_message(str(exc) or type(exc).__name__)


def malformed(message: str, *, status: int | None = None) -> ProviderFailure:
    return ProviderFailure(kind="malformed", status=status, message=message[:MAX_MESSAGE_CHARS])
