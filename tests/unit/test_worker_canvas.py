"""The canvas is built from Celery primitives: chord(stage 1, chord(stage 2, chairman))."""

from __future__ import annotations

import time

from celery import chord

from shared.models import CoverageReceipt
from shared.pipeline import RunPlan
from shared.response import SnapshotInfo
from shared.settings import CouncilSettings
from shared.tiers import Tier
from worker.canvas import CHAIRMAN, STAGE1, STAGE2, build_workflow
from worker.celery_app import make_app
from worker.config import HARD_GRACE_S, STAGE_GRACE_S, WorkerSettings


def _plan(now: float) -> RunPlan:
    return RunPlan(
        verification_id="v1",
        created_at=now,
        tier=Tier.HIGH,
        deadline_at=now + 360,
        stage1_end=now + 160,
        stage2_end=now + 250,
        per_call_cap_s=120,
        models=("a:m1", "a:m2", "a:m3"),
        chairman="a:c",
        seed=1,
        prefix="",
        confidence_threshold=0.7,
        min_stage1_reviewers=2,
        ack_reasons=(),
        snapshot=SnapshotInfo(requested="HEAD", resolved="0" * 40),
        coverage=CoverageReceipt(),
        transcript_path="/tmp/x",
    )


def test_workflow_shape_queue_and_time_limits():
    settings = CouncilSettings(broker_url="redis://127.0.0.1:6379/0")
    app = make_app("slow", settings, WorkerSettings())
    now = time.time()
    plan = _plan(now)
    wf = build_workflow(app, plan, now=now)
    # chain(group, group, task) is upgraded by Celery to chord(stage 1, chord(stage 2, chairman)).
    assert isinstance(wf, chord)
    stage1 = list(wf.tasks)
    inner = wf.body
    assert isinstance(inner, chord)
    stage2 = list(inner.tasks)
    chair = inner.body
    assert [s.task for s in stage1] == [STAGE1] * 3
    assert [s.task for s in stage2] == [STAGE2] * 3
    assert chair.task == CHAIRMAN
    for sig in [*stage1, *stage2, chair]:
        assert sig.options["queue"] == "council.high"
        assert sig.options["time_limit"] == sig.options["soft_time_limit"] + HARD_GRACE_S
    assert stage1[0].options["soft_time_limit"] == 160 + STAGE_GRACE_S
    assert stage2[0].options["soft_time_limit"] == 250 + STAGE_GRACE_S
    # Stage-1 tasks take no parent result; stage-2 tasks receive the stage-1 results.
    assert stage1[0].immutable and not stage2[0].immutable
    assert stage1[1].args == ("v1", "a:m2", plan.deadline_at)
    assert stage2[2].args == ("v1", "a:m3", plan.deadline_at)
    assert chair.args == ("v1", plan.deadline_at)
