"""Progress of a verification, readable by id from any surface."""

from __future__ import annotations

from typing import Literal

from shared.models import Frozen
from shared.response import VerifyResponse

StateName = Literal["queued", "stage1", "stage2", "chairman", "done"]


class StageProgress(Frozen):
    done: int = 0
    total: int = 0


class VerificationState(Frozen):
    verification_id: str
    state: StateName
    tier: str
    created_at: float
    deadline_at: float
    updated_at: float
    stage1: StageProgress = StageProgress()
    stage2: StageProgress = StageProgress()
    chairman: StageProgress = StageProgress()
    payload: VerifyResponse | None = None
