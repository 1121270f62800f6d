"""Time budget allocation that cannot starve the chairman.

The verify deadline D (tier budget x timeout multiplier x 2.0) is fixed when a verification
is created. The chairman's share is reserved first, then peer review's:

    chairman_reserve = D x chairman_reserve_fraction          (default 0.30)
    stage2_reserve   = D x (1 - chairman_reserve_fraction) x 0.35
    stage1 ends at   created + D - chairman_reserve - stage2_reserve
    stage2 ends at   created + D - chairman_reserve
    chairman ends at created + D

A stage that finishes early hands its unused time to the next. Every call's timeout is the
smaller of the tier's per-call cap and what its stage has left, so a slow stage 1 ends at
its own boundary and the chairman always keeps at least its reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.models import Stage

STAGE2_SHARE_OF_REST = 0.35
#: Below this many seconds an attempt is not worth starting.
MIN_CALL_S = 0.2


@dataclass(frozen=True)
class Budget:
    created_at: float
    deadline_at: float
    stage1_end: float
    stage2_end: float
    per_call_cap_s: float

    @classmethod
    def allocate(
        cls,
        created_at: float,
        total_s: float,
        per_call_cap_s: float,
        chairman_reserve_fraction: float = 0.3,
    ) -> Budget:
        chairman_reserve = total_s * chairman_reserve_fraction
        stage2_reserve = (total_s - chairman_reserve) * STAGE2_SHARE_OF_REST
        deadline = created_at + total_s
        return cls(
            created_at=created_at,
            deadline_at=deadline,
            stage1_end=deadline - chairman_reserve - stage2_reserve,
            stage2_end=deadline - chairman_reserve,
            per_call_cap_s=per_call_cap_s,
        )

    def stage_end(self, stage: Stage) -> float:
        return {
            Stage.STAGE1: self.stage1_end,
            Stage.STAGE2: self.stage2_end,
            Stage.CHAIRMAN: self.deadline_at,
        }[stage]

    def call_timeout(self, stage: Stage, now: float) -> float:
        """Seconds one call of `stage` may take if it starts at `now` (may be <= 0)."""
        return min(self.per_call_cap_s, self.stage_end(stage) - now)
