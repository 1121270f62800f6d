"""Review tiers: time budgets, input caps and the verify deadline derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Tier(StrEnum):
    QUICK = "quick"
    BALANCED = "balanced"
    HIGH = "high"
    REASONING = "reasoning"


#: A verification runs to twice its tier budget so stage 3 is not starved on a slow day.
#: Deliberately a code constant, not a setting.
VERIFICATION_TIMEOUT_MULTIPLIER = 2.0


@dataclass(frozen=True)
class TierSpec:
    budget_s: float
    max_input_chars: int
    per_call_cap_s: float


TIER_SPECS: dict[Tier, TierSpec] = {
    Tier.QUICK: TierSpec(budget_s=30.0, max_input_chars=15_000, per_call_cap_s=20.0),
    Tier.BALANCED: TierSpec(budget_s=90.0, max_input_chars=30_000, per_call_cap_s=60.0),
    Tier.HIGH: TierSpec(budget_s=180.0, max_input_chars=50_000, per_call_cap_s=120.0),
    Tier.REASONING: TierSpec(budget_s=600.0, max_input_chars=50_000, per_call_cap_s=400.0),
}

_ORDER = [Tier.QUICK, Tier.BALANCED, Tier.HIGH, Tier.REASONING]


def parse_tier(value: str) -> Tier:
    """Parse a tier name, raising ValueError that lists the valid names."""
    try:
        return Tier(value.strip().lower())
    except ValueError:
        valid = ", ".join(t.value for t in _ORDER)
        raise ValueError(f"unknown tier {value!r}; expected one of: {valid}") from None


def next_tier(tier: Tier) -> Tier | None:
    """The tier above `tier`, or None at the top."""
    idx = _ORDER.index(tier)
    return _ORDER[idx + 1] if idx + 1 < len(_ORDER) else None


def tier_budget_s(tier: Tier, timeout_multiplier: float = 1.0) -> float:
    return TIER_SPECS[tier].budget_s * timeout_multiplier


def verify_deadline_s(tier: Tier, timeout_multiplier: float = 1.0) -> float:
    """Seconds a whole verification may take: tier budget x multiplier x 2.0."""
    return tier_budget_s(tier, timeout_multiplier) * VERIFICATION_TIMEOUT_MULTIPLIER
