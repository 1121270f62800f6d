"""Thin Celery tasks around the shared stage functions.

- `council.stage1(vid, model, deadline_at)` -> the stored Stage1Answer (JSON text)
- `council.stage2(stage1_results, vid, model, deadline_at)` -> the stored PeerReview, or
  `{"skipped": model}` when the model has no stage-2 assignment (it failed stage 1)
- `council.chairman(stage2_results, vid, deadline_at, armed_at=None)` -> the final payload

A model's failure is a value (the stage functions return `ok=False` with an error marker),
never an exception, so a dead model cannot keep a chord from reaching the chairman. Every
stage result goes through the idempotent store under (verification, stage, model): a
redelivered or duplicated task returns the stored result, or waits on the running call's
lease, and never calls the provider for a result that exists.

The chairman's `soft_time_limit` is what is left of the verification's budget when it is
published (the moment stage 2 completes, see `arm_chairman`), its hard limit HARD_GRACE_S
beyond; a chairman that starts later than that (it waited in the queue, or was redelivered)
re-queues itself with fresh limits (`Task.replace`). When the soft limit fires, it returns
the partial payload (`timeout_fired`, `completed_stages`, unclear `timeout`) through the
same `finalize` as every other outcome.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import before_task_publish, worker_process_init
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.models import ChairmanReport, PeerReview, ProviderFailure, Stage, Stage1Answer
from shared.pipeline import (
    DEADLINE_SLACK_S,
    RunPlan,
    deadline_fired,
    labels_for,
    stage2_assignments,
    synthesise,
)
from shared.response import VerifyResponse
from shared.stages import aggregate, run_stage1, run_stage2
from worker.closing import (
    SKIPPED,
    completed_stages,
    finalize_once,
    missing_answer,
    missing_review,
    parse_stage1_results,
    parse_stage2_results,
    record_done,
    reviews_in_order,
    stored_answers,
)
from worker.config import (
    HARD_GRACE_S,
    SOFT_LEAD_S,
    STAGE_GRACE_S,
    queue_name,
    queue_of_routing_key,
)
from worker.context import Context, worker_context

log = logging.getLogger(__name__)
# One INFO line per provider request drowns the worker log; failures still show as warnings.
logging.getLogger("httpx").setLevel(logging.WARNING)

#: A chairman that starts this long after it was armed was redelivered: arm it again, so
#: its soft limit still ends at the deadline.
REARM_AFTER_S = 1.0
SOFT_LIMIT_MESSAGE = "the chairman's soft time limit fired at the verify deadline"


class CouncilTask(Task):
    """A retried council task goes back to the tier queue its message came from.

    Celery rebuilds a retry's route from the delivery info. With a countdown on quorum
    queues (RabbitMQ's native delayed delivery) it would take the routing key of the app's
    *default* queue instead, putting a balanced task on `council.quick`; naming the queue
    keeps the retry on its tier's queue, whatever the broker."""

    def signature_from_request(
        self,
        request: Any = None,
        args: Any = None,
        kwargs: Any = None,
        queue: str | None = None,
        **extra_options: Any,
    ) -> Any:
        if queue is None:
            info = (self.request if request is None else request).delivery_info or {}
            queue = queue_of_routing_key(info.get("routing_key"))
        return super().signature_from_request(request, args, kwargs, queue=queue, **extra_options)


RETRY: dict[str, Any] = {
    "base": CouncilTask,
    "autoretry_for": (RedisConnectionError, RedisTimeoutError),
    "retry_backoff": 1,
    "retry_backoff_max": 10,
    "max_retries": 8,
    # Results are model answers and payloads: log their start, not kilobytes of JSON.
    "resultrepr_maxsize": 160,
}


@worker_process_init.connect
def warm_up(**_: Any) -> None:
    """Build each pool process's context (settings, Redis client, provider client) when it
    starts, not during the first verification it serves. No network I/O here: a child must
    finish starting within Celery's `worker_proc_alive_timeout`."""
    try:
        _ = worker_context().provider
    except Exception as exc:  # never keep a pool process from starting
        log.warning("worker warm-up incomplete: %s", exc)


def _lost(vid: str) -> ProviderFailure:
    return ProviderFailure(
        kind="workflow_lost", message=f"verification {vid} has no plan in Redis (lost or expired)"
    )


def _stage_call(
    ctx: Context,
    plan: RunPlan,
    stage: Stage,
    model: str,
    call: Callable[[], str],
    on_timeout: Callable[[], str],
    stage_end: float,
    *,
    total: int | None = None,
) -> str:
    """Run one model's call once per (verification, stage, model); return the stored JSON.

    The state update (this stage has started; this model's call is done) travels in the
    same Redis round trips as the store's lookup and write."""
    vid = plan.verification_id
    result_key = ctx.keys.result(vid, stage.value, model)
    ttl = ctx.record_ttl(plan)

    def compute() -> str:
        try:
            return call()
        except SoftTimeLimitExceeded:
            return on_timeout()

    def before(pipe: Any) -> None:
        if total is not None:
            ctx.state.mark_done(vid, stage.value, None, ttl, total=total, pipe=pipe)
        ctx.state.advance(vid, stage.value, ttl, pipe=pipe)

    def after(pipe: Any) -> None:
        ctx.state.mark_done(vid, stage.value, model, ttl, pipe=pipe)

    try:
        outcome = ctx.store.run_once(
            result_key,
            ctx.keys.lease(vid, stage.value, model),
            compute,
            ttl_s=ttl,
            wait_until=stage_end + STAGE_GRACE_S,
            give_up=on_timeout,
            before=before,
            after=after,
        )
        return outcome.value
    except SoftTimeLimitExceeded:
        raw = ctx.store.put_if_absent(result_key, on_timeout(), ttl)
        ctx.state.mark_done(vid, stage.value, model, ttl)
        return raw


@shared_task(name="council.stage1", bind=True, **RETRY)
def stage1(self: Any, vid: str, model: str, deadline_at: float) -> str:
    ctx = worker_context()
    plan = ctx.plan(vid)
    if plan is None:
        return Stage1Answer(model=model, ok=False, error=_lost(vid)).model_dump_json()

    def call() -> str:
        answer = run_stage1(
            ctx.provider,
            model,
            prefix=plan.prefix,
            verification_id=vid,
            timeout_s=plan.budget.call_timeout(Stage.STAGE1, time.time()),
            deadline_at=plan.stage1_end,
        )
        return answer.model_dump_json()

    def on_timeout() -> str:
        return missing_answer(model, "stage 1 ended").model_dump_json()

    return _stage_call(ctx, plan, Stage.STAGE1, model, call, on_timeout, plan.stage1_end)


@shared_task(name="council.stage2", bind=True, **RETRY)
def stage2(self: Any, stage1_results: list[str], vid: str, model: str, deadline_at: float) -> str:
    ctx = worker_context()
    plan = ctx.plan(vid)
    if plan is None:
        return PeerReview(reviewer=model, ok=False, error=_lost(vid)).model_dump_json()
    answers = parse_stage1_results(plan, stage1_results)
    assignments = stage2_assignments(plan, answers)
    if model not in assignments:
        ttl = ctx.record_ttl(plan)
        ctx.state.mark_done(vid, Stage.STAGE2.value, None, ttl, total=len(assignments))
        return json.dumps({SKIPPED: model})

    def call() -> str:
        review = run_stage2(
            ctx.provider,
            model,
            prefix=plan.prefix,
            shown=assignments[model],
            verification_id=vid,
            timeout_s=plan.budget.call_timeout(Stage.STAGE2, time.time()),
            deadline_at=plan.stage2_end,
        )
        return review.model_dump_json()

    def on_timeout() -> str:
        return missing_review(model, "stage 2 ended").model_dump_json()

    return _stage_call(
        ctx, plan, Stage.STAGE2, model, call, on_timeout, plan.stage2_end, total=len(assignments)
    )


def _timed_out_report(plan: RunPlan, message: str) -> ChairmanReport:
    return ChairmanReport(
        model=plan.chairman,
        ok=False,
        timed_out=True,
        error=ProviderFailure(kind="timeout", message=message),
    )


@before_task_publish.connect
def arm_chairman(
    sender: str | None = None,
    body: Any = None,
    headers: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """Set a chairman message's time limits from the budget left when it is published.

    The chord callback is published by the worker that finishes the last stage-2 task, so
    its limits are computed then, not when the canvas was built (that would add the time
    stages 1 and 2 took). The publish time travels as `armed_at`.
    """
    if sender != CHAIRMAN_TASK or headers is None or not isinstance(body, tuple | list):
        return
    args, kwargs = body[0], body[1]
    if len(args) < 3 or not isinstance(kwargs, dict):
        return
    now = time.time()
    remaining = float(args[2]) - now
    if remaining <= SOFT_LEAD_S:
        return  # past the deadline: the chairman only salvages, under its dispatch limits
    soft = remaining - SOFT_LEAD_S
    headers["timelimit"] = [soft + HARD_GRACE_S, soft]
    kwargs["armed_at"] = now


CHAIRMAN_TASK = "council.chairman"


@shared_task(name=CHAIRMAN_TASK, bind=True, ignore_result=True, **RETRY)
def chairman(
    self: Any,
    stage2_results: list[str],
    vid: str,
    deadline_at: float,
    armed_at: float | None = None,
) -> str:
    ctx = worker_context()
    final = ctx.store.get(ctx.keys.final(vid))
    if final is not None:
        record_done(ctx, vid)
        return final
    plan = ctx.plan(vid)
    if plan is None:
        # Nothing to finalize with: the waiting runner or the watchdog closes it.
        log.warning("chairman for %s: the plan is gone; leaving it to the watchdog", vid)
        return json.dumps({"lost": vid})
    ctx.state.advance(vid, "chairman", ctx.record_ttl(plan))
    now = time.time()
    if (armed_at is None or now - armed_at > REARM_AFTER_S) and (
        plan.deadline_at - now > SOFT_LEAD_S
    ):
        # Published long ago (queued behind other work, or redelivered): its soft limit
        # would fire after the deadline. Re-queue it; `arm_chairman` sets fresh limits.
        rearmed = self.signature((stage2_results, vid, deadline_at), queue=queue_name(plan.tier))
        return self.replace(rearmed)
    try:
        return _chair(ctx, plan, stage2_results).model_dump_json()
    except SoftTimeLimitExceeded:
        # The soft limit fired outside the provider call (while storing or finalizing).
        # Close again: no time is left for a call, so this only salvages what is stored.
        return _chair(ctx, plan, stage2_results).model_dump_json()


def _chair(ctx: Context, plan: RunPlan, stage2_results: list[str]) -> VerifyResponse:
    vid = plan.verification_id
    ttl = ctx.record_ttl(plan)
    answers = stored_answers(ctx, plan)
    reviews = reviews_in_order(plan, answers, parse_stage2_results(stage2_results))
    agg = aggregate(labels_for(plan, answers), reviews, plan.seed)
    soft_at = plan.deadline_at - SOFT_LEAD_S

    def compute() -> str:
        try:
            report = synthesise(plan, ctx.provider, answers, agg)
        except SoftTimeLimitExceeded:
            return _timed_out_report(plan, SOFT_LIMIT_MESSAGE).model_dump_json()
        if not report.ok and time.time() >= soft_at - DEADLINE_SLACK_S:
            # The soft limit (or the deadline) cut the call short; the stage function
            # reports that as a generic error, but it is the deadline that fired.
            message = (
                SOFT_LIMIT_MESSAGE
                if report.error and "SoftTimeLimitExceeded" in report.error.message
                else report.error.message
                if report.error
                else "the verify deadline passed"
            )
            report = report.model_copy(
                update={
                    "timed_out": True,
                    "error": ProviderFailure(kind="timeout", message=message),
                }
            )
        return report.model_dump_json()

    try:
        outcome = ctx.store.run_once(
            ctx.keys.result(vid, Stage.CHAIRMAN.value, plan.chairman),
            ctx.keys.lease(vid, Stage.CHAIRMAN.value, plan.chairman),
            compute,
            ttl_s=ttl,
            wait_until=plan.deadline_at + STAGE_GRACE_S,
            give_up=lambda: _timed_out_report(plan, "the verify deadline passed").model_dump_json(),
        )
        raw = outcome.value
    except SoftTimeLimitExceeded:
        raw = ctx.store.put_if_absent(
            ctx.keys.result(vid, Stage.CHAIRMAN.value, plan.chairman),
            _timed_out_report(plan, SOFT_LIMIT_MESSAGE).model_dump_json(),
            ttl,
        )
    report = ChairmanReport.model_validate_json(raw)
    ctx.state.mark_done(vid, Stage.CHAIRMAN.value, plan.chairman, ttl)
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
