"""`HttpProviderClient`: the real `ProviderClient`, one small client for both API shapes.

Keys: `openrouter:` needs OPENROUTER_API_KEY, `openai:` OPENAI_API_KEY, `anthropic:`
ANTHROPIC_API_KEY; `openai-compat@...` takes LLM_COUNCIL_OPENAI_COMPAT_API_KEY when set.
A ref with an explicit `@<base-url>` never requires a key: the provider's key is sent when
one is configured, and none otherwise (local servers, the offline fake provider).

Retries: 408, 409, 429, 5xx, connection failures and timeouts are retried with jittered
exponential backoff (0.5 s doubling, capped at 8 s), or after the provider's
`retry-after-ms` / `retry-after` when given; `x-should-retry` forces or forbids a retry.
400, 401, 402, 403, 404 and billing failures are never retried. No attempt starts, and no
backoff sleeps, past `deadline_at`; each attempt's timeout is `min(timeout_s, time left)`
and covers the whole response, not only the wait between bytes.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from shared.models import ProviderFailure, Usage
from shared.providers import anthropic, openai_compat
from shared.providers.base import CallMeta, Completion, ProviderError
from shared.providers.errors import (
    failure_from_exception,
    failure_from_response,
    malformed,
    retry_after_s,
    should_retry,
)
from shared.providers.http import CONNECT_TIMEOUT_S, RequestSpec, get_http_client
from shared.providers.refs import ModelRef, parse_model_ref

if TYPE_CHECKING:
    from shared.settings import CouncilSettings

log = logging.getLogger(__name__)

#: Sent with every attempt (1, 2, ...) so a server can tell a retry from a duplicate call.
HEADER_ATTEMPT = "X-LLM-Council-Attempt"

#: Environment variables that hold each provider's key.
KEY_ENV: dict[str, str] = {
    "openrouter": "OPENROUTER_API_KEY",
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "openai-compat": "LLM_COUNCIL_OPENAI_COMPAT_API_KEY",
}
#: Providers whose public endpoint cannot be called without a key.
KEY_REQUIRED = frozenset({"openrouter", "openai", "anthropic"})

MIN_ATTEMPT_S = 0.2
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
MAX_RETRY_AFTER_S = 120.0
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ProviderKeys:
    """API keys per provider. Never printed: the fields are left out of `repr`."""

    openrouter: str | None = field(default=None, repr=False)
    openai: str | None = field(default=None, repr=False)
    anthropic: str | None = field(default=None, repr=False)
    openai_compat: str | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: CouncilSettings) -> ProviderKeys:
        def reveal(name: str) -> str | None:
            secret = getattr(settings, name, None)
            value = secret.get_secret_value() if secret is not None else None
            return (value.strip() or None) if value else None

        return cls(
            openrouter=reveal("openrouter_api_key"),
            openai=reveal("openai_api_key"),
            anthropic=reveal("anthropic_api_key"),
            openai_compat=reveal("openai_compat_api_key"),
        )

    def for_provider(self, provider: str) -> str | None:
        return {
            "openrouter": self.openrouter,
            "openai": self.openai,
            "anthropic": self.anthropic,
            "openai-compat": self.openai_compat,
        }.get(provider)

    def secrets(self) -> tuple[str, ...]:
        return tuple(
            k for k in (self.openrouter, self.openai, self.anthropic, self.openai_compat) if k
        )


def key_required(ref: ModelRef) -> bool:
    """A public endpoint needs its key; an explicit base URL (local server, proxy) does not."""
    return ref.provider in KEY_REQUIRED and not ref.explicit_base


def missing_credentials(refs: Iterable[ModelRef | str], keys: ProviderKeys) -> list[str]:
    """The environment variables that must be set before these models can be called,
    in first-use order, without duplicates."""
    missing: list[str] = []
    for item in refs:
        ref = parse_model_ref(item) if isinstance(item, str) else item
        if key_required(ref) and not keys.for_provider(ref.provider):
            env = KEY_ENV[ref.provider]
            if env not in missing:
                missing.append(env)
    return missing


class _AttemptFailed(Exception):
    def __init__(
        self,
        failure: ProviderFailure,
        headers: Mapping[str, str] | httpx.Headers | None = None,
        schema_rejected: bool = False,
    ) -> None:
        super().__init__(failure.kind)
        self.failure = failure
        self.headers = headers
        self.schema_rejected = schema_rejected


class HttpProviderClient:
    """Calls OpenAI-compatible and Anthropic endpoints over one pooled httpx client."""

    def __init__(
        self,
        keys: ProviderKeys,
        *,
        max_attempts: int = 4,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_cap_s: float = BACKOFF_CAP_S,
        max_retry_after_s: float = MAX_RETRY_AFTER_S,
        cache_ttl: str | None = None,
        prompt_caching: bool = True,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._keys = keys
        self._max_attempts = max_attempts
        self._http = http
        self._sleep = sleep
        self._clock = clock
        self._rand = rand
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._max_retry_after_s = max_retry_after_s
        self._cache_ttl = cache_ttl
        self._prompt_caching = prompt_caching
        # (base_url, model) pairs whose server rejected `response_format`: ask without it.
        self._no_schema: set[tuple[str, str]] = set()

    @classmethod
    def from_settings(cls, settings: CouncilSettings) -> HttpProviderClient:
        """The client every runner uses: keys, retry policy and cache TTL from settings."""
        return cls(
            ProviderKeys.from_settings(settings),
            max_attempts=settings.provider_max_attempts,
            backoff_base_s=settings.provider_backoff_s,
            cache_ttl=settings.prompt_cache_ttl,
            prompt_caching=settings.prompt_caching,
        )

    # ProviderClient ------------------------------------------------------------------
    def complete(
        self,
        ref: ModelRef,
        *,
        system: str,
        cacheable_prefix: str,
        prompt: str,
        schema: dict[str, object] | None,
        schema_name: str,
        timeout_s: float,
        deadline_at: float | None,
        meta: CallMeta,
    ) -> Completion:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if not self._prompt_caching:  # no cache breakpoint: one plain user message
            cacheable_prefix, prompt = "", cacheable_prefix + prompt
        key = self._keys.for_provider(ref.provider)
        if key_required(ref) and not key:
            raise ProviderError(
                ProviderFailure(
                    kind="auth",
                    message=f"{KEY_ENV[ref.provider]} is not set; {ref.id} cannot be called",
                    attempts=0,
                )
            )
        request_texts = (system, cacheable_prefix, prompt)
        use_schema = schema is not None and (ref.base_url, ref.model) not in self._no_schema
        schema_fallback_done = False
        attempts = 0
        counted = 0  # attempts that count against max_attempts (not the schema fallback)
        last: ProviderFailure | None = None
        started = time.perf_counter()

        while True:
            attempt_timeout = timeout_s
            if deadline_at is not None:
                remaining = deadline_at - self._clock()
                if remaining < MIN_ATTEMPT_S:
                    raise ProviderError(_final(last, attempts))
                attempt_timeout = min(timeout_s, remaining)
            attempts += 1
            spec = self._build(
                ref, key, system, cacheable_prefix, prompt, schema, schema_name, meta, use_schema
            )
            try:
                text, usage, finish = self._attempt(
                    ref, spec, attempts, attempt_timeout, request_texts, use_schema
                )
            except _AttemptFailed as failed:
                last = failed.failure
                if failed.schema_rejected and not schema_fallback_done:
                    # Some local servers lack `response_format`: ask once more without it.
                    schema_fallback_done = True
                    use_schema = False
                    self._no_schema.add((ref.base_url, ref.model))
                    log.info("%s rejected response_format; retrying without it", ref.id)
                    continue
                counted += 1
                if counted >= self._max_attempts or not should_retry(last, failed.headers):
                    raise ProviderError(_final(last, attempts)) from None
                delay = self._delay(failed.headers, counted)
                if deadline_at is not None and self._clock() + delay + MIN_ATTEMPT_S > deadline_at:
                    raise ProviderError(_final(last, attempts)) from None
                log.info(
                    "%s attempt %d failed (%s%s); retrying in %.2fs",
                    ref.id,
                    attempts,
                    last.kind,
                    f" {last.status}" if last.status else "",
                    delay,
                )
                self._sleep(delay)
                continue
            return Completion(
                text=text,
                usage=usage,
                finish_reason=finish,
                latency_ms=int((time.perf_counter() - started) * 1000),
                attempts=attempts,
            )

    # Internals -----------------------------------------------------------------------
    def _build(
        self,
        ref: ModelRef,
        key: str | None,
        system: str,
        cacheable_prefix: str,
        prompt: str,
        schema: dict[str, object] | None,
        schema_name: str,
        meta: CallMeta,
        use_schema: bool,
    ) -> RequestSpec:
        if ref.shape == "anthropic":
            return anthropic.build_request(
                ref,
                key=key,
                system=system,
                cacheable_prefix=cacheable_prefix,
                prompt=prompt,
                meta=meta,
                cache_ttl=self._cache_ttl,
            )
        return openai_compat.build_request(
            ref,
            key=key,
            system=system,
            cacheable_prefix=cacheable_prefix,
            prompt=prompt,
            schema=schema,
            schema_name=schema_name,
            meta=meta,
            use_schema=use_schema,
            cache_ttl=self._cache_ttl,
        )

    def _attempt(
        self,
        ref: ModelRef,
        spec: RequestSpec,
        attempt: int,
        timeout: float,
        request_texts: tuple[str, ...],
        used_schema: bool,
    ) -> tuple[str, Usage, str | None]:
        secrets = self._keys.secrets()
        status, headers, body = self._send(spec, attempt, timeout)
        if not 200 <= status < 300:
            text = body.decode("utf-8", "replace")
            failure = failure_from_response(
                status, text, secrets=secrets, request_texts=request_texts
            )
            rejected = (
                used_schema
                and ref.shape == "openai"
                and openai_compat.is_schema_rejection(status, text)
            )
            raise _AttemptFailed(failure, headers, schema_rejected=rejected)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise _AttemptFailed(
                malformed(f"response body is not JSON ({len(body)} bytes)", status=status),
                headers,
            ) from None
        parse = (
            anthropic.parse_response if ref.shape == "anthropic" else (openai_compat.parse_response)
        )
        try:
            return parse(data, secrets=secrets, request_texts=request_texts)
        except ProviderError as exc:
            raise _AttemptFailed(exc.failure, headers) from None

    def _send(
        self, spec: RequestSpec, attempt: int, timeout: float
    ) -> tuple[int, httpx.Headers, bytes]:
        client = self._http or get_http_client()
        headers = {**spec.headers, HEADER_ATTEMPT: str(attempt)}
        t0 = time.monotonic()
        try:
            with client.stream(
                "POST",
                spec.url,
                json=spec.body,
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S)),
            ) as resp:
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise _AttemptFailed(
                            malformed("response body too large", status=resp.status_code),
                            resp.headers,
                        )
                    chunks.append(chunk)
                    if time.monotonic() - t0 > timeout:
                        # A server that trickles bytes (keep-alive whitespace) never trips
                        # httpx's read timeout: hold the whole response to the budget.
                        raise _AttemptFailed(
                            ProviderFailure(
                                kind="timeout",
                                message=f"no complete response within {timeout:.1f}s",
                            )
                        )
                return resp.status_code, resp.headers, b"".join(chunks)
        except httpx.HTTPError as exc:
            raise _AttemptFailed(failure_from_exception(exc)) from None

    def _delay(self, headers: Mapping[str, str] | httpx.Headers | None, retry: int) -> float:
        asked = retry_after_s(headers, now=self._clock())
        if asked is not None:
            return min(asked, self._max_retry_after_s)
        ceiling = min(self._backoff_cap_s, self._backoff_base_s * (2 ** (retry - 1)))
        return ceiling * (0.5 + 0.5 * self._rand())


def _final(last: ProviderFailure | None, attempts: int) -> ProviderFailure:
    if last is None:
        return ProviderFailure(
            kind="timeout",
            message="the deadline passed before the call could start",
            attempts=attempts,
        )
    return last.model_copy(update={"attempts": attempts})
