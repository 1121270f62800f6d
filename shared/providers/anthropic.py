"""The Anthropic Messages shape.

Request: POST `{base_url}/v1/messages` with `x-api-key` (when there is a key),
`anthropic-version: 2023-06-01`, the council headers, `max_tokens` 8192, the system prompt,
and one user message of two text blocks: the cacheable prefix marked
`cache_control: {"type": "ephemeral"}`, then the prompt (one block when the prefix is empty).

Anthropic has no `response_format`: the schema is left to the prompt, which already asks for
one JSON object.

Usage: `prompt_tokens` counts every input token, cached or not
(`input_tokens + cache_read_input_tokens + cache_creation_input_tokens`), as OpenAI's
`prompt_tokens` does, so figures from both shapes add up the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shared.models import Usage
from shared.providers.base import CallMeta, ProviderError
from shared.providers.errors import failure_from_error_object, malformed
from shared.providers.http import RequestSpec, council_headers
from shared.providers.openai_compat import token_count
from shared.providers.refs import ModelRef

ANTHROPIC_VERSION = "2023-06-01"
MAX_TOKENS = 8192

#: Anthropic stop reasons in the OpenAI vocabulary the parsers use ("length" = cut off).
_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}


def messages_url(ref: ModelRef) -> str:
    return f"{ref.base_url}/v1/messages"


def build_request(
    ref: ModelRef,
    *,
    key: str | None,
    system: str,
    cacheable_prefix: str,
    prompt: str,
    schema: Mapping[str, object] | None = None,
    schema_name: str = "",
    meta: CallMeta,
    max_tokens: int = MAX_TOKENS,
    cache_ttl: str | None = None,
) -> RequestSpec:
    headers = {
        "Content-Type": "application/json",
        "anthropic-version": ANTHROPIC_VERSION,
        **council_headers(meta),
    }
    if key:
        headers["x-api-key"] = key
    blocks: list[dict[str, Any]] = []
    if cacheable_prefix:
        cache: dict[str, str] = {"type": "ephemeral"}
        if cache_ttl:
            cache["ttl"] = cache_ttl
        blocks.append({"type": "text", "text": cacheable_prefix, "cache_control": cache})
    blocks.append({"type": "text", "text": prompt})
    body: dict[str, Any] = {
        "model": ref.model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": blocks}],
    }
    if system:
        body["system"] = system
    return RequestSpec(url=messages_url(ref), headers=headers, body=body)


def parse_usage(usage: Any) -> Usage:
    if not isinstance(usage, Mapping):
        return Usage()
    read = token_count(usage.get("cache_read_input_tokens"))
    write = token_count(usage.get("cache_creation_input_tokens"))
    return Usage(
        prompt_tokens=token_count(usage.get("input_tokens")) + read + write,
        completion_tokens=token_count(usage.get("output_tokens")),
        cached_tokens=read,
        cache_write_tokens=write,
    )


def parse_response(
    data: Any, *, secrets: Iterable[str] = (), request_texts: Iterable[str] = ()
) -> tuple[str, Usage, str | None]:
    """(text, usage, finish_reason) from a 2xx body; `finish_reason` is "length" when the
    output hit `max_tokens`."""
    if not isinstance(data, Mapping):
        raise ProviderError(malformed("response body is not a JSON object"))
    if data.get("type") == "error" or (data.get("error") and "content" not in data):
        raise ProviderError(
            failure_from_error_object(
                data.get("error"), secrets=secrets, request_texts=request_texts
            )
        )
    content = data.get("content")
    if not isinstance(content, list):
        raise ProviderError(malformed("response has no content blocks"))
    text = "".join(
        block["text"]
        for block in content
        if isinstance(block, Mapping)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )
    stop = data.get("stop_reason")
    finish = _STOP_REASONS.get(stop, stop) if isinstance(stop, str) else None
    return text, parse_usage(data.get("usage")), finish
