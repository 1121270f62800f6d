"""The OpenAI-compatible chat completions shape (OpenRouter, OpenAI, Ollama, vLLM, llama.cpp).

Request: POST `{base_url}/chat/completions` with a system and a user message (user content is
`cacheable_prefix + prompt`), `response_format` of type `json_schema` when a schema is given,
`Authorization: Bearer <key>` when there is a key, and the council headers.

On OpenRouter, Anthropic models cache prompt prefixes only when asked with `cache_control`
content parts, so for `openrouter:anthropic/...` the user content is sent as two text parts
with the prefix marked cacheable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from shared.models import Usage
from shared.providers.base import CallMeta, ProviderError
from shared.providers.errors import failure_from_error_object, malformed
from shared.providers.http import RequestSpec, council_headers
from shared.providers.refs import ModelRef

_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")
_SCHEMA_REJECTION = ("response_format", "json_schema", "response format", "json schema")


def chat_url(ref: ModelRef) -> str:
    return f"{ref.base_url}/chat/completions"


def schema_name_for(name: str) -> str:
    """OpenAI accepts `^[a-zA-Z0-9_-]{1,64}$` as a schema name."""
    return (_SCHEMA_NAME.sub("_", name) or "answer")[:64]


def wants_cache_control(ref: ModelRef) -> bool:
    return ref.provider == "openrouter" and ref.model.startswith("anthropic/")


def build_request(
    ref: ModelRef,
    *,
    key: str | None,
    system: str,
    cacheable_prefix: str,
    prompt: str,
    schema: Mapping[str, object] | None,
    schema_name: str,
    meta: CallMeta,
    use_schema: bool = True,
    cache_ttl: str | None = None,
) -> RequestSpec:
    headers = {"Content-Type": "application/json", **council_headers(meta)}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    user: str | list[dict[str, Any]]
    if cacheable_prefix and wants_cache_control(ref):
        cache: dict[str, str] = {"type": "ephemeral"}
        if cache_ttl:
            cache["ttl"] = cache_ttl
        user = [
            {"type": "text", "text": cacheable_prefix, "cache_control": cache},
            {"type": "text", "text": prompt},
        ]
    else:
        user = cacheable_prefix + prompt
    body: dict[str, Any] = {
        "model": ref.model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
    }
    if schema is not None and use_schema:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": schema_name_for(schema_name),
                "schema": dict(schema),
                "strict": False,
            },
        }
    return RequestSpec(url=chat_url(ref), headers=headers, body=body)


def is_schema_rejection(status: int, body: str) -> bool:
    """A 400 that blames `response_format`: the server does not support JSON schemas."""
    if status != 400:
        return False
    text = body.lower()
    return any(word in text for word in _SCHEMA_REJECTION)


def token_count(value: Any) -> int:
    """A token count from a usage field: non-negative int, anything unreadable is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and value == value and value not in (float("inf"), -float("inf")):
        return max(0, int(value))
    return 0


def parse_usage(usage: Any) -> Usage:
    if not isinstance(usage, Mapping):
        return Usage()
    details = usage.get("prompt_tokens_details")
    cached = write = 0
    if isinstance(details, Mapping):
        cached = token_count(details.get("cached_tokens"))
        write = token_count(details.get("cache_write_tokens"))
    return Usage(
        prompt_tokens=token_count(usage.get("prompt_tokens")),
        completion_tokens=token_count(usage.get("completion_tokens")),
        cached_tokens=cached,
        cache_write_tokens=write,
    )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, as some servers return
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return ""


def parse_response(
    data: Any, *, secrets: Iterable[str] = (), request_texts: Iterable[str] = ()
) -> tuple[str, Usage, str | None]:
    """(text, usage, finish_reason) from a 2xx body; raises ProviderError when it carries
    an error object or no usable choice."""
    if not isinstance(data, Mapping):
        raise ProviderError(malformed("response body is not a JSON object"))
    choices = data.get("choices")
    if data.get("error") and not choices:
        raise ProviderError(
            failure_from_error_object(data["error"], secrets=secrets, request_texts=request_texts)
        )
    if not isinstance(choices, list) or not choices:
        raise ProviderError(malformed("response has no choices"))
    choice = choices[0]
    if not isinstance(choice, Mapping):
        raise ProviderError(malformed("response choice is not an object"))
    if choice.get("error"):
        raise ProviderError(
            failure_from_error_object(choice["error"], secrets=secrets, request_texts=request_texts)
        )
    message = choice.get("message")
    text = _content_text(message.get("content")) if isinstance(message, Mapping) else ""
    finish = choice.get("finish_reason")
    return text, parse_usage(data.get("usage")), finish if isinstance(finish, str) else None
