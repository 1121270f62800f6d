"""Killed and stopped workers: every verification still ends with exactly one payload, and
no (verification, stage, model) whose call completed is ever called again.

The call that a kill interrupts is made to hang by a one-shot fault in the fake provider,
so it never completes on the provider's side either: after recovery the provider has
seen two calls for that key and exactly one completed. Recovery takes the stack's short
visibility timeout (4 s) plus a restore scan (0.5 s); see docs/workflow.md for the
production values.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from shared import transcript
from tests.helpers import SQL_INJECTION
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    Background,
    CeleryStack,
    WorkerProcess,
    calls_by_key,
    make_plan,
    stored_results,
    wait_until,
)
from worker.runner import run_remote

pytestmark = pytest.mark.integration
celery_stack = worker_fixtures.celery_stack  # the fixture, for this module's tests

HOLD = "slow-1500"
MEMBERS = ("careful-1", "careful-2", HOLD, "lenient-1")


def _hang_once(model: str, stage: str) -> dict[str, Any]:
    return {model: {"behaviour": "hang-8000", "stages": [stage], "times": 1}}


def _in_flight(
    stack: CeleryStack, fake: Any, vid: str, stage: str, model: str, others_done: int
) -> Callable[[], bool]:
    """`model`'s call in `stage` has started, and `others_done` other results of that stage
    are stored (not merely answered: a kill between the two would re-run them)."""

    def check() -> bool:
        held = calls_by_key(fake, vid).get((stage, model), {}).get("calls", 0) >= 1
        stored = [m for s, m in stored_results(stack, vid) if s == stage and m != model]
        return held and len(stored) >= others_done

    return check


def _run_disrupted(
    stack: CeleryStack,
    fake: Any,
    repo: Any,
    *,
    members: tuple[str, ...] = MEMBERS,
    chairman: str = "careful-chair",
    faults: dict[str, Any] | None = None,
    ready: Callable[[str], Callable[[], bool]],
    disrupt: Callable[[WorkerProcess, str], None],
    worker_env: dict[str, str] | None = None,
) -> tuple[Any, Any, set[tuple[str, str]]]:
    worker = stack.worker(concurrency=4, env=worker_env).start()
    settings = stack.settings(fake, members=members, chairman=chairman)
    fake.configure(faults=faults or {})
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    vid = plan.verification_id
    run = Background(lambda: run_remote(plan, settings, options=stack.worker_settings()))
    wait_until(ready(vid), 30, "the call to hold")
    stored_before = stored_results(stack, vid)
    disrupt(worker, vid)
    payload = run.join(timeout=90)
    return plan, payload, stored_before


def _assert_recovered(stack: CeleryStack, fake: Any, plan: Any, payload: Any, stored: set) -> None:
    vid = plan.verification_id
    assert payload.verification_id == vid
    assert (payload.verdict.value, payload.exit_code) == ("fail", 1), payload.rationale
    assert payload.completed_stages == ("stage1", "stage2", "chairman")
    assert payload.runner == "celery"
    # Exactly one payload: finalize ran once, and the transcript holds that payload.
    ctx = stack.context(stack.settings(fake))
    assert int(ctx.client.get(ctx.keys.finalized(vid))) == 1
    assert ctx.store.get(ctx.keys.final(vid)) == payload.model_dump_json()
    assert json.loads((plan.folder / "result.json").read_text()) == payload.model_dump(mode="json")
    assert transcript.validate(plan.folder) == []
    # No completed (verification, stage, model) called twice.
    calls = calls_by_key(fake, vid)
    for key, count in calls.items():
        assert count["completed"] <= 1, (key, count)
    for key in stored:
        assert calls[key]["calls"] == 1, (key, calls[key])


def _kill_whole_worker_and_restart(worker: WorkerProcess, vid: str) -> None:
    worker.kill_all()
    worker.restart()


def test_sigkill_whole_worker_during_stage1(celery_stack, fake_provider, repo):
    plan, payload, stored = _run_disrupted(
        celery_stack,
        fake_provider,
        repo,
        faults=_hang_once(HOLD, "stage1"),
        ready=lambda vid: _in_flight(celery_stack, fake_provider, vid, "stage1", HOLD, 3),
        disrupt=_kill_whole_worker_and_restart,
    )
    _assert_recovered(celery_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls[("stage1", HOLD)] == {"calls": 2, "completed": 1}
    assert len(stored) == 3 and ("stage1", HOLD) not in stored


def test_sigkill_whole_worker_during_stage2(celery_stack, fake_provider, repo):
    plan, payload, stored = _run_disrupted(
        celery_stack,
        fake_provider,
        repo,
        faults=_hang_once(HOLD, "stage2"),
        ready=lambda vid: _in_flight(celery_stack, fake_provider, vid, "stage2", HOLD, 3),
        disrupt=_kill_whole_worker_and_restart,
    )
    _assert_recovered(celery_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls[("stage2", HOLD)] == {"calls": 2, "completed": 1}
    assert sum(1 for s, _ in stored if s == "stage1") == 4


def test_sigkill_whole_worker_during_chairman(celery_stack, fake_provider, repo):
    chair = "slow-1200"
    plan, payload, stored = _run_disrupted(
        celery_stack,
        fake_provider,
        repo,
        chairman=chair,
        faults=_hang_once(chair, "chairman"),
        ready=lambda vid: _in_flight(celery_stack, fake_provider, vid, "chairman", chair, 0),
        disrupt=_kill_whole_worker_and_restart,
    )
    _assert_recovered(celery_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls[("chairman", chair)] == {"calls": 2, "completed": 1}
    assert len(stored) == 8  # every stage-1 and stage-2 result survived the kill


def test_sigkill_of_one_pool_child(celery_stack, fake_provider, repo):
    killed: list[int] = []

    def kill_the_holder(worker: WorkerProcess, vid: str) -> None:
        ctx = celery_stack.context(celery_stack.settings(fake_provider))
        model_id = fake_provider.model_id(HOLD)
        from worker.store import holder_pid

        holder = ctx.store.lease_holder(ctx.keys.lease(vid, "stage1", model_id))
        assert holder is not None, "the held call has no lease"
        pid = holder_pid(holder)
        assert pid is not None
        worker.kill_child(pid)
        killed.append(pid)

    plan, payload, stored = _run_disrupted(
        celery_stack,
        fake_provider,
        repo,
        faults=_hang_once(HOLD, "stage1"),
        ready=lambda vid: _in_flight(celery_stack, fake_provider, vid, "stage1", HOLD, 3),
        disrupt=kill_the_holder,
    )
    _assert_recovered(celery_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls[("stage1", HOLD)] == {"calls": 2, "completed": 1}
    worker = celery_stack.workers[0]
    assert worker.alive() and killed and killed[0] not in worker.children()


def test_sigterm_warm_shutdown_during_stage1(celery_stack, fake_provider, repo):
    hold = "slow-2000"
    members = ("careful-1", "careful-2", hold, "lenient-1")
    exit_codes: list[int] = []

    def warm_shutdown_then_restart(worker: WorkerProcess, vid: str) -> None:
        exit_codes.append(worker.warm_shutdown(timeout=30))
        # The running call was allowed to finish and its result stored before the exit.
        assert calls_by_key(fake_provider, vid)[("stage1", hold)] == {"calls": 1, "completed": 1}
        time.sleep(0.5)
        worker.restart()

    plan, payload, stored = _run_disrupted(
        celery_stack,
        fake_provider,
        repo,
        members=members,
        ready=lambda vid: _in_flight(celery_stack, fake_provider, vid, "stage1", hold, 3),
        disrupt=warm_shutdown_then_restart,
    )
    assert exit_codes == [0]
    _assert_recovered(celery_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert all(c == {"calls": 1, "completed": 1} for c in calls.values()), calls


def test_sigterm_remapped_to_a_bounded_soft_shutdown_hands_the_call_back(
    celery_stack, fake_provider, repo
):
    """The slow group's procedure: REMAP_SIGTERM=SIGQUIT with a soft shutdown timeout. A call
    still running when the timeout ends is cancelled and its message handed back at once."""
    exit_codes: list[int] = []

    def bounded_shutdown_then_restart(worker: WorkerProcess, vid: str) -> None:
        t0 = time.time()
        exit_codes.append(worker.warm_shutdown(timeout=30))
        assert time.time() - t0 < 6.0  # the soft shutdown timeout, not the hanging call
        worker.restart()

    plan, payload, stored = _run_disrupted(
        celery_stack,
        fake_provider,
        repo,
        faults=_hang_once(HOLD, "stage1"),
        ready=lambda vid: _in_flight(celery_stack, fake_provider, vid, "stage1", HOLD, 3),
        disrupt=bounded_shutdown_then_restart,
        worker_env={"REMAP_SIGTERM": "SIGQUIT", "LLM_COUNCIL_SOFT_SHUTDOWN_TIMEOUT": "1"},
    )
    assert len(exit_codes) == 1
    _assert_recovered(celery_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls[("stage1", HOLD)] == {"calls": 2, "completed": 1}
