"""Nothing waits forever: the watchdog closes verifications whose deadline passed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from shared import transcript
from tests.helpers import SQL_INJECTION
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    ROOT,
    TEST_WAIT_GRACE_S,
    Background,
    calls_by_key,
    make_plan,
    stored_results,
    wait_until,
)
from worker.runner import get_state, run_remote, submit_remote
from worker.watchdog import LOST_MESSAGE, TIMEOUT_MESSAGE

pytestmark = pytest.mark.integration
celery_stack = worker_fixtures.celery_stack  # the fixture, for this module's tests

HOLD = "slow-1500"
MEMBERS = ("careful-1", "careful-2", HOLD, "lenient-1")


def _finalized(stack, settings, vid: str) -> int:
    ctx = stack.context(settings)
    return int(ctx.client.get(ctx.keys.finalized(vid)) or 0)


def test_lost_workflow_is_closed_as_infra_failure_by_the_deadline(
    celery_stack, fake_provider, repo
):
    celery_stack.worker(concurrency=4).start()
    # quick x 0.1: a 6 s verification.
    settings = celery_stack.settings(fake_provider, members=MEMBERS, timeout_multiplier=0.1)
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    vid = plan.verification_id
    run = Background(lambda: run_remote(plan, settings, options=celery_stack.worker_settings()))
    wait_until(
        lambda: calls_by_key(fake_provider, vid).get(("stage1", HOLD), {}).get("calls"),
        10,
        "stage 1 to start",
    )
    # Lose the workflow: every key of this stack (our records, the queued and unacked
    # messages, the chord counters), except the broker's queue bindings.
    assert celery_stack.delete_keys(keep=lambda key: "_kombu.binding." in key) > 0
    payload = run.join(timeout=30)
    assert payload.verdict.value == "unclear"
    assert payload.unclear_reason is not None
    assert payload.unclear_reason.value == "infra_failure"
    assert payload.rationale == LOST_MESSAGE
    assert payload.runner == "celery"
    # Closed by the deadline plus the runner's grace, not later.
    assert run.finished_at is not None
    assert run.finished_at <= plan.deadline_at + TEST_WAIT_GRACE_S + 2.0
    assert transcript.validate(plan.folder) == []
    assert json.loads((plan.folder / "result.json").read_text())["unclear_reason"] == (
        "infra_failure"
    )
    # The tasks still running when the keys vanished cannot revive or re-close it.
    time.sleep(2.0)
    assert _finalized(celery_stack, settings, vid) == 1
    state = get_state(vid, settings, options=celery_stack.worker_settings())
    assert state is not None and state.payload == payload


def test_killed_worker_without_recovery_is_closed_as_timeout(celery_stack, fake_provider, repo):
    # A visibility timeout far beyond the deadline: the killed worker's tasks cannot come
    # back in time (the production situation for a whole-worker SIGKILL on Redis).
    celery_stack.visibility_timeout = 120.0
    worker = celery_stack.worker(concurrency=4).start()
    settings = celery_stack.settings(fake_provider, members=MEMBERS, timeout_multiplier=0.1)
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    vid = plan.verification_id
    run = Background(lambda: run_remote(plan, settings, options=celery_stack.worker_settings()))
    wait_until(
        lambda: (
            calls_by_key(fake_provider, vid).get(("stage1", HOLD), {}).get("calls")
            and len(stored_results(celery_stack, vid)) == 3
        ),
        10,
        "three stage-1 answers stored and the fourth call running",
    )
    worker.kill_all()
    payload = run.join(timeout=30)
    assert payload.verdict.value == "unclear"
    assert payload.unclear_reason is not None and payload.unclear_reason.value == "timeout"
    assert payload.timeout_fired and payload.partial
    assert payload.completed_stages == ("stage1",)
    assert payload.diagnostics.chairman_error is not None
    assert payload.diagnostics.chairman_error.message == TIMEOUT_MESSAGE
    assert payload.diagnostics.stage1_answers == 3  # stored before the kill, salvaged
    assert run.finished_at is not None
    assert run.finished_at <= plan.deadline_at + TEST_WAIT_GRACE_S + 2.0
    assert _finalized(celery_stack, settings, vid) == 1


def test_watchdog_command_closes_what_nobody_waits_for(celery_stack, fake_provider, repo):
    # No worker at all, nobody waiting: a submitted verification must still be closed.
    settings = celery_stack.settings(fake_provider, timeout_multiplier=0.02)  # 1.2 s
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    submit_remote(plan, settings, options=celery_stack.worker_settings())
    time.sleep(max(0.0, plan.deadline_at + TEST_WAIT_GRACE_S - time.time()) + 0.2)
    cli = [sys.executable, "-m", "api.cli", "watchdog"]
    out = subprocess.run(
        cli, cwd=ROOT, env=celery_stack.env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert f"{plan.verification_id} unclear infra_failure" in out.stdout.splitlines()
    state = get_state(plan.verification_id, settings, options=celery_stack.worker_settings())
    assert state is not None and state.state == "done" and state.payload is not None
    assert state.payload.unclear_reason is not None
    assert transcript.validate(plan.folder) == []
    # A second sweep finds nothing left to close.
    again = subprocess.run(
        cli, cwd=ROOT, env=celery_stack.env(), capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and plan.verification_id not in again.stdout
