"""Model ids: `<provider>:<model>` or `<provider>@<base-url>:<model>`.

Providers: `openrouter`, `openai`, `anthropic` (their public endpoints, keys from the
environment) and `openai-compat` (any OpenAI-compatible server; needs `@<base-url>`).
`@<base-url>` overrides the endpoint for any provider, e.g.
`openai-compat@http://127.0.0.1:11434/v1:llama3:8b` or `anthropic@http://127.0.0.1:9000:careful`.
A base URL is `http(s)://host[:port][/path]`; the model is everything after the next `:`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ApiShape = Literal["openai", "anthropic"]

PROVIDERS: dict[str, tuple[ApiShape, str | None]] = {
    "openrouter": ("openai", "https://openrouter.ai/api/v1"),
    "openai": ("openai", "https://api.openai.com/v1"),
    "anthropic": ("anthropic", "https://api.anthropic.com"),
    "openai-compat": ("openai", None),
}

_WITH_BASE = re.compile(
    r"^(?P<provider>[a-z][a-z0-9-]*)@(?P<base>https?://[^/:\s]+(?::\d+)?(?:/[^:\s]*)?):(?P<model>\S+)$"
)
_PLAIN = re.compile(r"^(?P<provider>[a-z][a-z0-9-]*):(?P<model>\S+)$")


class ModelRefError(ValueError):
    pass


@dataclass(frozen=True)
class ModelRef:
    provider: str
    model: str
    base_url: str
    shape: ApiShape
    explicit_base: bool = False

    @property
    def id(self) -> str:
        if self.explicit_base:
            return f"{self.provider}@{self.base_url}:{self.model}"
        return f"{self.provider}:{self.model}"

    def __str__(self) -> str:
        return self.id


def parse_model_ref(value: str) -> ModelRef:
    """Parse a model id, raising ModelRefError that says what form is expected."""
    text = value.strip()
    m = _WITH_BASE.match(text) or _PLAIN.match(text)
    if not m:
        raise ModelRefError(
            f"invalid model id {value!r}: expected '<provider>:<model>' or "
            f"'<provider>@<base-url>:<model>' with provider one of {', '.join(PROVIDERS)}"
        )
    provider = m.group("provider")
    if provider not in PROVIDERS:
        raise ModelRefError(
            f"invalid model id {value!r}: unknown provider {provider!r}; "
            f"expected one of {', '.join(PROVIDERS)}"
        )
    shape, default_base = PROVIDERS[provider]
    base = m.groupdict().get("base")
    if base is None and default_base is None:
        raise ModelRefError(
            f"invalid model id {value!r}: provider {provider!r} needs a base URL, "
            f"e.g. '{provider}@http://127.0.0.1:8000/v1:<model>'"
        )
    return ModelRef(
        provider=provider,
        model=m.group("model"),
        base_url=(base or default_base or "").rstrip("/"),
        shape=shape,
        explicit_base=base is not None,
    )
