"""Killed and stopped workers: every verification still ends with exactly one payload, and
no (verification, stage, model) whose call completed is ever called again.

The call that a kill interrupts is made to hang by a one-shot fault in the fake provider,
so it never completes on the provider's side either: after recovery the provider has
seen two calls for that key and exactly one completed.

The whole-worker kills and the warm shutdown run once per broker (`broker_stack`):

- Redis: recovery takes the stack's short visibility timeout (4 s) plus a restore scan
  (0.5 s); the production values (215 s, 1235 s) are in docs/workflow.md.
- RabbitMQ: production settings (there is no visibility timeout). The broker requeues a
  killed worker's unacknowledged messages when its connection drops, so the test asserts
  they are back in the queue within a second of the kill and that the interrupted call
  runs again within a few seconds of the restart.

Each kill test prints its figures (`pytest -s` or `-rP` shows them; docs/brokers.md
quotes them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from shared import transcript
from shared.tiers import Tier
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
from worker.config import queue_name
from worker.runner import run_remote

pytestmark = pytest.mark.integration
# The fixtures, for this module's tests.
celery_stack = worker_fixtures.celery_stack
broker_stack = worker_fixtures.broker_stack
rabbitmq = worker_fixtures.rabbitmq

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
    runs: list[Background] | None = None,
) -> tuple[Any, Any, set[tuple[str, str]]]:
    worker = stack.worker(concurrency=4, env=worker_env).start()
    settings = stack.settings(fake, members=members, chairman=chairman)
    fake.configure(faults=faults or {})
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    vid = plan.verification_id
    run = Background(lambda: run_remote(plan, settings, options=stack.worker_settings()))
    if runs is not None:
        runs.append(run)
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


def _queued(stack: CeleryStack, queue: str) -> int:
    """Messages ready in `queue` of the stack's RabbitMQ vhost (a passive declare)."""
    from kombu import Connection

    with Connection(stack.broker, connect_timeout=3) as conn:
        return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)


class KillAndRestart:
    """SIGKILL the whole worker, restart it a moment later, and time the recovery: when the
    killed message was back in the queue (RabbitMQ only: Redis puts it back only when a
    restarted worker's restore scan finds it past its visibility timeout), and when the
    interrupted call started again."""

    def __init__(self, stack: CeleryStack, fake: Any, stage: str, model: str) -> None:
        self.stack, self.fake, self.stage, self.model = stack, fake, stage, model
        self.killed_at = self.requeued_at = self.ready_at = self.recalled_at = 0.0

    def __call__(self, worker: WorkerProcess, vid: str) -> None:
        worker.kill_all()
        self.killed_at = time.time()
        if self.stack.is_amqp:
            queue = queue_name(Tier.QUICK)
            wait_until(lambda: _queued(self.stack, queue) >= 1, 10, "the message to be requeued")
            self.requeued_at = time.time()
        time.sleep(max(0.0, self.killed_at + RESTART_AFTER_S - time.time()))
        worker.restart()
        self.ready_at = time.time()

        def recalled() -> bool:
            calls = calls_by_key(self.fake, vid).get((self.stage, self.model), {})
            return calls.get("calls", 0) >= 2

        wait_until(recalled, 60, "the interrupted call to run again", step=0.02)
        self.recalled_at = time.time()

    def check(self, finished_at: float | None) -> None:
        """Print the figures; on RabbitMQ, assert they are seconds, not a timeout."""
        assert finished_at is not None
        back = self.recalled_at - self.ready_at
        total = finished_at - self.killed_at
        requeued = (
            f"message requeued {1000 * (self.requeued_at - self.killed_at):.0f} ms after the kill, "
            if self.stack.is_amqp
            else ""
        )
        print(
            f"\n[recovery] {self.stack.broker_kind}: whole worker SIGKILLed in {self.stage}, "
            f"restarted {RESTART_AFTER_S:.0f} s later: {requeued}call re-run {back:.2f} s "
            f"after the restart, payload {total:.2f} s after the kill"
        )
        if self.stack.is_amqp:
            assert self.requeued_at - self.killed_at < 1.0
            assert back < 3.0, f"call re-run {back:.1f} s after the restart"
            assert total < 20.0, f"payload {total:.1f} s after the kill"


#: A killed worker comes back this long after the kill (a supervisor's restart delay).
RESTART_AFTER_S = 1.0


def test_sigkill_whole_worker_during_stage1(broker_stack, fake_provider, repo):
    kill = KillAndRestart(broker_stack, fake_provider, "stage1", HOLD)
    run: list[Background] = []
    plan, payload, stored = _run_disrupted(
        broker_stack,
        fake_provider,
        repo,
        faults=_hang_once(HOLD, "stage1"),
        ready=lambda vid: _in_flight(broker_stack, fake_provider, vid, "stage1", HOLD, 3),
        disrupt=kill,
        runs=run,
    )
    kill.check(run[0].finished_at)
    _assert_recovered(broker_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls[("stage1", HOLD)] == {"calls": 2, "completed": 1}
    assert len(stored) == 3 and ("stage1", HOLD) not in stored


def test_sigkill_whole_worker_during_stage2(broker_stack, fake_provider, repo):
    kill = KillAndRestart(broker_stack, fake_provider, "stage2", HOLD)
    run: list[Background] = []
    plan, payload, stored = _run_disrupted(
        broker_stack,
        fake_provider,
        repo,
        faults=_hang_once(HOLD, "stage2"),
        ready=lambda vid: _in_flight(broker_stack, fake_provider, vid, "stage2", HOLD, 3),
        disrupt=kill,
        runs=run,
    )
    kill.check(run[0].finished_at)
    _assert_recovered(broker_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls[("stage2", HOLD)] == {"calls": 2, "completed": 1}
    assert sum(1 for s, _ in stored if s == "stage1") == 4


def test_sigkill_whole_worker_during_chairman(broker_stack, fake_provider, repo):
    chair = "slow-1200"
    kill = KillAndRestart(broker_stack, fake_provider, "chairman", chair)
    run: list[Background] = []
    plan, payload, stored = _run_disrupted(
        broker_stack,
        fake_provider,
        repo,
        chairman=chair,
        faults=_hang_once(chair, "chairman"),
        ready=lambda vid: _in_flight(broker_stack, fake_provider, vid, "chairman", chair, 0),
        disrupt=kill,
        runs=run,
    )
    kill.check(run[0].finished_at)
    _assert_recovered(broker_stack, fake_provider, plan, payload, stored)
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


def test_sigterm_warm_shutdown_during_stage1(broker_stack, fake_provider, repo):
    hold = "slow-2000"
    members = ("careful-1", "careful-2", hold, "lenient-1")
    exit_codes: list[int] = []
    restarted: list[float] = []

    def warm_shutdown_then_restart(worker: WorkerProcess, vid: str) -> None:
        exit_codes.append(worker.warm_shutdown(timeout=30))
        # The running call was allowed to finish and its result stored before the exit.
        assert calls_by_key(fake_provider, vid)[("stage1", hold)] == {"calls": 1, "completed": 1}
        time.sleep(0.5)
        worker.restart()
        restarted.append(time.time())

    run: list[Background] = []
    plan, payload, stored = _run_disrupted(
        broker_stack,
        fake_provider,
        repo,
        members=members,
        ready=lambda vid: _in_flight(broker_stack, fake_provider, vid, "stage1", hold, 3),
        disrupt=warm_shutdown_then_restart,
        runs=run,
    )
    assert exit_codes == [0]
    _assert_recovered(broker_stack, fake_provider, plan, payload, stored)
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert all(c == {"calls": 1, "completed": 1} for c in calls.values()), calls
    finished_at = run[0].finished_at
    assert finished_at is not None
    print(
        f"\n[recovery] {broker_stack.broker_kind}: warm shutdown (SIGTERM) in stage1: payload "
        f"{finished_at - restarted[0]:.2f} s after the restart"
    )
    if broker_stack.is_amqp:  # the handed-back messages are waiting; nothing times out
        assert finished_at - restarted[0] < 10.0


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
