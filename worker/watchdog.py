"""The watchdog: no verification waits forever.

A verification whose global deadline has passed without a final payload is closed with
what the store holds, through the same `finalize_once` as the chairman (transcript
included, exactly once: if the chairman finalizes at the same moment, one of the two
payloads is stored and both callers return it):

- a stored chairman report (the chairman finished but its task died before finalizing):
  finalized as the chairman would have, so no paid-for synthesis is thrown away;
- work was under way (a worker took a task): unclear `timeout`, with `completed_stages`
  and the retry hint;
- the workflow vanished (its records are gone from Redis, or no worker ever took it):
  unclear `infra_failure`.

A waiting runner calls `close` for its own verification when its wait ends; operators
run `llm-council watchdog` (one `sweep`) from cron or a systemd timer for verifications
nobody waits on (submitted over the HTTP API).
"""

from __future__ import annotations

import logging
import time

from shared.models import ChairmanReport, ProviderFailure, Stage
from shared.pipeline import RunPlan, deadline_fired, labels_for, stage2_assignments
from shared.response import VerifyResponse
from shared.stages import aggregate
from worker.closing import (
    completed_stages,
    finalize_once,
    reviews_in_order,
    stored_answers,
    stored_reviews,
    under_way,
)
from worker.context import Context

log = logging.getLogger(__name__)

TIMEOUT_MESSAGE = "the verify deadline passed before the chairman finished (closed by the watchdog)"
LOST_MESSAGE = (
    "the workflow vanished before the verify deadline: no worker ran it, or its records "
    "were lost from Redis (closed by the watchdog)"
)


def close(ctx: Context, plan: RunPlan) -> VerifyResponse:
    """The verification's payload: the stored one, or an unclear one written now."""
    vid = plan.verification_id
    final = ctx.store.get(ctx.keys.final(vid))
    if final is not None:
        return VerifyResponse.model_validate_json(final)
    answers = stored_answers(ctx, plan, missing="no stage-1 answer before the verify deadline")
    reviewers = list(stage2_assignments(plan, answers))
    reviews = reviews_in_order(
        plan,
        answers,
        stored_reviews(ctx, plan, reviewers),
        missing="no stage-2 review before the verify deadline",
    )
    agg = aggregate(labels_for(plan, answers), reviews, plan.seed)
    raw = ctx.store.get(ctx.keys.result(vid, Stage.CHAIRMAN.value, plan.chairman))
    if raw is not None:
        report = ChairmanReport.model_validate_json(raw)
    elif under_way(ctx, plan):
        report = ChairmanReport(
            model=plan.chairman,
            ok=False,
            timed_out=True,
            error=ProviderFailure(kind="timeout", message=TIMEOUT_MESSAGE),
        )
    else:
        report = ChairmanReport(
            model=plan.chairman,
            ok=False,
            rationale=LOST_MESSAGE,
            error=ProviderFailure(kind="workflow_lost", message=LOST_MESSAGE),
        )
    log.warning("watchdog closing verification %s (%s)", vid, report.error or "stored report")
    return finalize_once(
        ctx,
        plan,
        answers,
        reviews,
        agg,
        report,
        fired=deadline_fired(plan, report),
        completed=completed_stages(answers, reviews, report),
    )


def load_plan(ctx: Context, vid: str) -> RunPlan | None:
    """The full plan, or the copy kept on the watchdog's list (without the subject text)."""
    plan = ctx.plan(vid)
    if plan is not None:
        return plan
    raw = ctx.client.hget(ctx.keys.plans, vid)
    return RunPlan.model_validate_json(raw) if raw else None


def due(ctx: Context, now: float | None = None) -> list[str]:
    t = time.time() if now is None else now
    ids = ctx.client.zrangebyscore(ctx.keys.deadlines, "-inf", t - ctx.ws.wait_grace_s)
    return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]


def sweep(ctx: Context, now: float | None = None) -> list[VerifyResponse]:
    """Close every verification past its deadline (plus the runner's grace)."""
    closed = []
    for vid in due(ctx, now):
        plan = load_plan(ctx, vid)
        if plan is None:
            log.warning("watchdog: verification %s has no plan left; dropping it", vid)
            ctx.client.zrem(ctx.keys.deadlines, vid)
            continue
        closed.append(close(ctx, plan))
    return closed
