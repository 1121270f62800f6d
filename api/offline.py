"""`--offline`: the same pipeline against the bundled fake provider on loopback."""

from __future__ import annotations

from typing import Any

from ops.fake_provider.server import FakeProvider
from shared.settings import CouncilSettings

OFFLINE_MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")
OFFLINE_CHAIRMAN = "careful-chair"


def offline_settings(settings: CouncilSettings, fake: FakeProvider) -> CouncilSettings:
    """The given settings with the council replaced by offline fake reviewers."""
    base = f"openai-compat@{fake.openai_base}"
    update: dict[str, Any] = {
        "models": [f"{base}:{m}" for m in OFFLINE_MEMBERS],
        "chairman": f"{base}:{OFFLINE_CHAIRMAN}",
        "tier_models": {},
        "tier_chairman": {},
        "fallback_chairman": None,
    }
    return settings.model_copy(update=update)
