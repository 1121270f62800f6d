"""Run one verification of a repository's HEAD through a chosen runner (fault tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.embedded import run_embedded
from shared.pipeline import plan_run
from shared.providers.client import HttpProviderClient
from shared.request import VerifyRequest
from shared.response import VerifyResponse
from shared.selection import resolve_subject
from shared.settings import load_settings
from shared.tiers import Tier

MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")
CHAIRMAN = "careful-chair"


def council(base: str, members=MEMBERS, chairman: str = CHAIRMAN) -> dict[str, Any]:
    return {
        "models": [f"openai-compat@{base}:{m}" for m in members],
        "chairman": f"openai-compat@{base}:{chairman}",
    }


def verify_head(
    repo: Path,
    runner: str,
    *,
    tier: Tier = Tier.QUICK,
    seed: int = 7,
    remote: Any = None,
    **overrides: Any,
) -> VerifyResponse:
    overrides.setdefault("provider_backoff_s", 0.02)
    if runner == "celery":
        assert remote is not None, "the celery runner needs a running worker"
        overrides.update(remote.settings_overrides)
    settings = load_settings(repo, **overrides)
    subject = resolve_subject(repo, "HEAD", None, settings=settings)
    plan = plan_run(VerifyRequest(tier=tier, shuffle_seed=seed), settings, subject)
    if runner == "embedded":
        return run_embedded(plan, HttpProviderClient.from_settings(settings))
    return remote.run(plan, settings)


def calls_of(fake: Any, verification_id: str) -> dict[tuple[str, str], int]:
    """(stage, model) -> requests received, for one verification."""
    return {
        (c["stage"], c["model"]): c["calls"]
        for c in fake.calls()
        if c["verification"] == verification_id
    }
