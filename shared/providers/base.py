"""The provider client contract shared by the stage functions and both runners."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from shared.models import ProviderFailure, Stage, Usage
from shared.providers.refs import ModelRef

#: Headers that label a call with its verification and stage. Real providers ignore them;
#: the offline fake provider counts calls by them.
HEADER_VERIFICATION = "X-LLM-Council-Verification"
HEADER_STAGE = "X-LLM-Council-Stage"


@dataclass(frozen=True)
class CallMeta:
    verification_id: str
    stage: Stage


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage
    finish_reason: str | None = None  # "stop", "length" (truncated), ...
    latency_ms: int = 0
    attempts: int = 1


class ProviderError(Exception):
    """A call that failed for good; `failure` keeps status, provider type and message."""

    def __init__(self, failure: ProviderFailure) -> None:
        super().__init__(f"{failure.kind}: {failure.message}")
        self.failure = failure


class ProviderClient(Protocol):
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
        """One chat completion whose user message is `cacheable_prefix + prompt`.

        The prefix is identical across the stages and rounds of one subject, so providers
        that cache prompt prefixes (Anthropic `cache_control`) may mark it cacheable.
        `timeout_s` caps one attempt; `deadline_at` is a wall-clock epoch no retry may pass.

        Raises ProviderError on failure (after retries).
        """
        ...
