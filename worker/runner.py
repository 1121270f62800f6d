"""The Celery runner: the same council as the embedded runner, as a durable workflow.

- `run_remote(plan, settings, *, on_progress)`: submit, show progress, wait, return the
  payload. It never waits past the verify deadline plus `wait_grace_s`: then it runs the
  watchdog for its verification, which returns the stored payload or writes an unclear one.
- `submit_remote(plan, settings)`: submit and return at once (the HTTP API).
- `get_state(verification_id, settings)`: progress and, once done, the payload.

Submitting checks first that the broker and the store answer; if either does not, it
raises ConnectionError with one clear line and leaves nothing behind (no Redis keys, and
the transcript folder `plan_run` started is removed again).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared import transcript
from shared.pipeline import RunPlan, finalize, write_outcome
from shared.response import VerifyResponse
from shared.settings import CouncilSettings
from shared.state import VerificationState
from worker import watchdog
from worker.config import (
    WorkerSettings,
    broker_url_for,
    group_of,
    is_redis_url,
    redact_url,
)
from worker.context import Context
from worker.state import RANKS, STAGES

ProgressFn = Callable[[str, int, int], None]

#: Seconds to wait for the broker or the store to answer before calling it unreachable.
REACH_TIMEOUT_S = 2.0
#: Publishing retries briefly, then gives up (the broker answered a moment ago).
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.0, "interval_step": 0.5, "interval_max": 1.0}
#: How long one wait for a progress event blocks before the state is read again anyway.
EVENT_WAIT_S = 1.0


def _noop(stage: str, done: int, total: int) -> None:
    return None


_contexts: dict[tuple[str, str], Context] = {}
_contexts_lock = threading.Lock()


def runner_context(settings: CouncilSettings, ws: WorkerSettings) -> Context:
    key = (settings.model_dump_json(), ws.model_dump_json())
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = Context.build(settings, ws)
            _contexts[key] = ctx
        return ctx


# --- reachability ------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


_pingers: dict[str, Any] = {}


def _check_redis(url: str) -> None:
    """PING with short timeouts, on a pooled client kept per URL (a submit costs one
    round trip, not a new connection)."""
    import redis

    with _contexts_lock:
        client = _pingers.get(url)
        if client is None:
            client = redis.Redis.from_url(
                url,
                socket_connect_timeout=REACH_TIMEOUT_S,
                socket_timeout=REACH_TIMEOUT_S,
                retry_on_timeout=False,
            )
            _pingers[url] = client
    try:
        client.ping()
    except Exception:
        client.connection_pool.disconnect()
        raise


def _check_kombu(url: str) -> None:
    from kombu import Connection

    with Connection(url, connect_timeout=REACH_TIMEOUT_S) as conn:
        conn.ensure_connection(max_retries=1, timeout=REACH_TIMEOUT_S)


def check_reachable(settings: CouncilSettings, ws: WorkerSettings, group: str) -> None:
    """Raise ConnectionError (one line) unless the group's broker and the store answer."""
    broker = broker_url_for(group, settings, ws)
    try:
        (_check_redis if is_redis_url(broker) else _check_kombu)(broker)
    except Exception as exc:
        raise ConnectionError(
            f"cannot reach the Celery broker at {redact_url(broker)} ({_reason(exc)}); "
            "start it, or unset LLM_COUNCIL_BROKER_URL to run in-process"
        ) from None
    if settings.redis_url != broker:
        try:
            _check_redis(settings.redis_url)
        except Exception as exc:
            raise ConnectionError(
                f"cannot reach the Redis store at {redact_url(settings.redis_url)} "
                f"({_reason(exc)}); start it or set LLM_COUNCIL_REDIS_URL"
            ) from None


def _discard_transcript(plan: RunPlan) -> None:
    """Remove what `plan_run` wrote for a verification that never started."""
    folder = plan.folder
    for name in ("request.json", "subject.txt"):
        (folder / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


# --- submit ------------------------------------------------------------------------------


def _plan_lite(plan: RunPlan) -> str:
    return plan.model_copy(update={"prefix": ""}).model_dump_json()


def _finalize_input_error(ctx: Context, plan: RunPlan, *, strict: bool = True) -> VerifyResponse:
    """Nothing to review: no model is called, so the runner closes it itself. Recording it
    in Redis (for readers by id) may fail only when `strict` is off."""
    from redis.exceptions import RedisError

    response = finalize(
        plan, {}, [], None, None, completed_stages=(), fired=False, timing={}, runner="celery"
    )
    vid = plan.verification_id
    pipe = ctx.client.pipeline()
    pipe.set(ctx.keys.final(vid), response.model_dump_json(), nx=True, ex=ctx.final_ttl)
    pipe.hset(
        ctx.keys.state(vid),
        mapping={
            **ctx.state.create_mapping(
                tier=plan.tier.value,
                created_at=plan.created_at,
                deadline_at=plan.deadline_at,
                models=len(plan.models),
            ),
            "state": "done",
            "rank": str(RANKS["done"]),
        },
    )
    pipe.expire(ctx.keys.state(vid), ctx.record_ttl(plan))
    try:
        pipe.execute()
    except RedisError:
        if strict:
            raise
    return response


def _submit(plan: RunPlan, settings: CouncilSettings, ws: WorkerSettings) -> Context:
    if not settings.broker_url:
        raise ValueError("no broker configured: set LLM_COUNCIL_BROKER_URL")
    group = group_of(plan.tier)
    try:
        check_reachable(settings, ws, group)
    except ConnectionError:
        _discard_transcript(plan)
        raise
    ctx = runner_context(settings, ws)
    if plan.input_error is not None:
        return ctx
    from redis.exceptions import RedisError

    from worker.canvas import build_workflow
    from worker.celery_app import get_app

    vid = plan.verification_id
    ttl = ctx.record_ttl(plan)
    state_key = ctx.keys.state(vid)
    pipe = ctx.client.pipeline(transaction=True)
    pipe.set(ctx.keys.plan(vid), plan.model_dump_json(), ex=ttl)
    pipe.delete(state_key)
    pipe.hset(
        state_key,
        mapping=ctx.state.create_mapping(
            tier=plan.tier.value,
            created_at=plan.created_at,
            deadline_at=plan.deadline_at,
            models=len(plan.models),
        ),
    )
    pipe.expire(state_key, ttl)
    pipe.zadd(ctx.keys.deadlines, {vid: plan.deadline_at})
    pipe.hset(ctx.keys.plans, vid, _plan_lite(plan))
    try:
        pipe.execute()  # one transaction: all of it or nothing
    except RedisError as exc:
        _discard_transcript(plan)
        raise ConnectionError(
            f"could not record verification {vid} in Redis at "
            f"{redact_url(settings.redis_url)} ({_reason(exc)})"
        ) from None
    from celery.result import denied_join_result

    app = get_app(group, settings, ws)
    try:
        # We wait on our own state keys, not on Celery results: do not let the result
        # backend subscribe to the chain's result channel.
        with denied_join_result():
            build_workflow(app, plan).apply_async(retry=True, retry_policy=PUBLISH_RETRY)
    except Exception as exc:
        _forget(ctx, vid)
        _discard_transcript(plan)
        raise ConnectionError(
            f"could not enqueue verification {vid} on "
            f"{redact_url(broker_url_for(group, settings, ws))} ({_reason(exc)})"
        ) from None
    return ctx


def _forget(ctx: Context, vid: str) -> None:
    pipe = ctx.client.pipeline()
    pipe.delete(
        ctx.keys.plan(vid), ctx.keys.state(vid), ctx.keys.events(vid), ctx.keys.finished(vid)
    )
    pipe.zrem(ctx.keys.deadlines, vid)
    pipe.hdel(ctx.keys.plans, vid)
    pipe.execute()


def submit_remote(
    plan: RunPlan, settings: CouncilSettings, *, options: WorkerSettings | None = None
) -> None:
    """Enqueue the verification and return; read it back with `get_state`."""
    ws = options or WorkerSettings()
    ctx = _submit(plan, settings, ws)
    if plan.input_error is not None:
        _finalize_input_error(ctx, plan)


def get_state(
    verification_id: str, settings: CouncilSettings, *, options: WorkerSettings | None = None
) -> VerificationState | None:
    ctx = runner_context(settings, options or WorkerSettings())
    return ctx.state.read(verification_id)


# --- wait --------------------------------------------------------------------------------


def mirror_transcript(ctx: Context, plan: RunPlan, payload: VerifyResponse) -> None:
    """When the worker wrote the transcript on another machine, write it here as well."""
    folder = plan.folder
    if (folder / transcript.RESULT_FILE).exists():
        return
    raw = ctx.client.get(ctx.keys.files(plan.verification_id))
    if raw:
        for name, obj in json.loads(raw).items():
            if Path(name).name == name:
                transcript.write_json(folder, name, obj)
    write_outcome(folder, payload)


class _Progress:
    def __init__(self, on_progress: ProgressFn) -> None:
        self.on_progress = on_progress
        self.seen: dict[str, tuple[int, int]] = {}

    def update(self, state: VerificationState) -> None:
        rank = RANKS[state.state]
        for stage in STAGES:
            if rank < RANKS[stage]:
                break
            progress = getattr(state, stage)
            now = (progress.done, progress.total)
            if stage == "stage2" and progress.total == 0 and rank == RANKS["stage2"]:
                continue
            if self.seen.get(stage) != now:
                self.seen[stage] = now
                self.on_progress(stage, *now)


def wait_for(ctx: Context, plan: RunPlan, on_progress: ProgressFn = _noop) -> VerifyResponse:
    """Wait for the payload, reporting progress, until the deadline plus the grace; then
    let the watchdog close the verification (it returns the stored payload if one exists).

    With a progress callback it wakes on every state change; without one, only when the
    payload is stored (or once a second, to notice the deadline)."""
    vid = plan.verification_id
    until = plan.deadline_at + ctx.ws.wait_grace_s
    report = on_progress is not _noop
    progress = _Progress(on_progress)
    wake = ctx.keys.events(vid) if report else ctx.keys.finished(vid)
    while True:
        if report:
            state = ctx.state.read(vid)
            payload = None if state is None else state.payload
            if state is not None:
                progress.update(state)
        else:
            final = ctx.store.get(ctx.keys.final(vid))
            payload = None if final is None else VerifyResponse.model_validate_json(final)
        if payload is not None:
            mirror_transcript(ctx, plan, payload)
            return payload
        remaining = until - time.time()
        if remaining <= 0:
            break
        ctx.client.blpop([wake], timeout=min(EVENT_WAIT_S, max(0.01, remaining)))
    payload = watchdog.close(ctx, plan)
    mirror_transcript(ctx, plan, payload)
    return payload


def run_remote(
    plan: RunPlan,
    settings: CouncilSettings,
    *,
    on_progress: ProgressFn = _noop,
    options: WorkerSettings | None = None,
) -> VerifyResponse:
    """Run the verification through the Celery workflow and return its payload."""
    ws = options or WorkerSettings()
    if plan.input_error is not None:
        # Nothing to review, no model to call: close it here, broker or not. Recording it
        # in Redis (for readers by id) is best effort.
        return _finalize_input_error(runner_context(settings, ws), plan, strict=False)
    from redis.exceptions import RedisError

    ctx = _submit(plan, settings, ws)
    try:
        return wait_for(ctx, plan, on_progress)
    except RedisError as exc:
        raise ConnectionError(
            f"lost Redis at {redact_url(settings.redis_url)} while waiting for verification "
            f"{plan.verification_id} ({_reason(exc)}); a worker may still finish it: read it "
            "back by id once Redis is up"
        ) from None


def close_expired(
    settings: CouncilSettings, *, options: WorkerSettings | None = None, now: float | None = None
) -> list[VerifyResponse]:
    """One watchdog sweep over the verifications past their deadline."""
    ctx = runner_context(settings, options or WorkerSettings())
    return watchdog.sweep(ctx, now)


__all__ = [
    "check_reachable",
    "close_expired",
    "get_state",
    "run_remote",
    "submit_remote",
]
