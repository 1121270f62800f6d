"""The council as a Celery canvas: `chain(group(stage 1), group(stage 2), chairman)`.

Celery turns it into `chord(stage-1 group, chord(stage-2 group, chairman))`: each stage-2
task receives the list of stage-1 results, the chairman the list of stage-2 results.
Every task goes to the verification's tier queue and carries its time limits:

- stage tasks: soft limit at their stage's end plus STAGE_GRACE_S (counted from now, so
  never earlier), hard limit HARD_GRACE_S later. The provider client already stops at the
  stage's end; the limits only guard against a call that ignores its timeout.
- chairman: limits for a salvage-only run here; when stage 2 completes and the chairman is
  published, `worker.tasks.arm_chairman` replaces them with a soft limit set to what is
  left of the budget (and a hard limit HARD_GRACE_S beyond).
"""

from __future__ import annotations

import time
from typing import Any

from shared.pipeline import RunPlan
from worker.config import DISPATCH_TIME_LIMIT_S, HARD_GRACE_S, STAGE_GRACE_S, queue_name

STAGE1 = "council.stage1"
STAGE2 = "council.stage2"
CHAIRMAN = "council.chairman"


def build_workflow(app: Any, plan: RunPlan, now: float | None = None) -> Any:
    from celery import chain, group

    t = time.time() if now is None else now
    queue = queue_name(plan.tier)
    vid, deadline = plan.verification_id, plan.deadline_at
    s1_soft = max(1.0, plan.stage1_end - t + STAGE_GRACE_S)
    s2_soft = max(1.0, plan.stage2_end - t + STAGE_GRACE_S)
    stage1 = group(
        app.signature(
            STAGE1,
            args=(vid, model, deadline),
            queue=queue,
            soft_time_limit=s1_soft,
            time_limit=s1_soft + HARD_GRACE_S,
            immutable=True,
        )
        for model in plan.models
    )
    stage2 = group(
        app.signature(
            STAGE2,
            args=(vid, model, deadline),
            queue=queue,
            soft_time_limit=s2_soft,
            time_limit=s2_soft + HARD_GRACE_S,
        )
        for model in plan.models
    )
    chairman = app.signature(
        CHAIRMAN,
        args=(vid, deadline),
        queue=queue,
        soft_time_limit=DISPATCH_TIME_LIMIT_S,
        time_limit=DISPATCH_TIME_LIMIT_S + HARD_GRACE_S,
    )
    return chain(stage1, stage2, chairman)
