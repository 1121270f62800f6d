"""The verify request, validated once at the edge."""

from __future__ import annotations

from pydantic import Field, field_validator

from shared.models import Frozen
from shared.tiers import Tier


class VerifyRequest(Frozen):
    snapshot_id: str = Field(default="HEAD", min_length=1, max_length=256)
    target_paths: tuple[str, ...] | None = None
    tier: Tier = Tier.BALANCED
    rubric_focus: tuple[str, ...] = ()
    confidence_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    repo: str | None = None
    shuffle_seed: int | None = Field(default=None, ge=0, lt=2**63)

    @field_validator("target_paths")
    @classmethod
    def _non_empty_paths(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return None
        cleaned = tuple(p.strip() for p in v if p.strip())
        return cleaned or None

    @field_validator("rubric_focus", mode="before")
    @classmethod
    def _split_focus(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(p.strip() for p in v.split(",") if p.strip())
        return v
