"""RabbitMQ's `consumer_timeout` fires while a task runs: nothing is paid twice.

RabbitMQ closes a channel whose delivery stays unacknowledged longer than
`consumer_timeout` (PRECONDITION_FAILED) and hands the message to a consumer again, while
the task that holds it is still running. Workers refuse to start when their hard limits
do not fit in the consumer timeout they were told about; this test covers the case where
they were told wrong (the broker's real timeout is far smaller), on a private RabbitMQ
node of our own (free ports, a temporary directory) with `consumer_timeout = 2000` ms and
channels that check it every 500 ms (RabbitMQ 3.10 checks on its channel tick, 60 s by
default, and ignores a per-queue timeout). The shared node is never reconfigured.

The stage-1 call of one model takes 6 s, three consumer timeouts. The worker reconnects
(`broker_channel_error_retry`), the redelivered copies wait on the running call's lease,
and the verification ends with exactly one payload and one provider call per
(stage, model).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SQL_INJECTION
from tests.integration.worker_fixtures import (
    CeleryStack,
    RabbitNode,
    amqp_stack_on,
    calls_by_key,
    make_plan,
    rabbit_program,
)
from worker.runner import run_remote

pytestmark = pytest.mark.integration

CONSUMER_TIMEOUT_MS = 2000
TICK_MS = 500
SLOW = "careful-3"
SLOW_MS = 6000


@pytest.fixture(scope="module")
def strict_rabbit() -> Iterator[RabbitNode]:
    if rabbit_program("rabbitmq-server", private=True) is None:
        pytest.skip("rabbitmq-server is not installed: cannot start a private RabbitMQ node")
    node = RabbitNode.start_private(consumer_timeout_ms=CONSUMER_TIMEOUT_MS, tick_ms=TICK_MS)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def strict_stack(strict_rabbit, redis_url: str, tmp_path: Path) -> Iterator[CeleryStack]:
    with amqp_stack_on(strict_rabbit, redis_url, tmp_path) as stack:
        yield stack


def test_a_task_outliving_consumer_timeout_is_not_paid_twice(
    strict_rabbit, strict_stack, fake_provider, repo
):
    assert strict_rabbit.get_env("consumer_timeout") == f"{{ok,{CONSUMER_TIMEOUT_MS}}}"
    # The worker is told RabbitMQ's default (30 min), so it starts: the misconfiguration
    # this test is about.
    worker = strict_stack.worker(concurrency=4).start()
    members = ("careful-1", "careful-2", SLOW, "lenient-1")
    settings = strict_stack.settings(fake_provider, members=members)
    fake_provider.configure(
        faults={SLOW: {"behaviour": f"slow-{SLOW_MS}", "stages": ["stage1"], "times": 1}}
    )
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    vid = plan.verification_id
    t0 = time.time()
    payload = run_remote(plan, settings, options=strict_stack.worker_settings())
    took = time.time() - t0

    # The failure mode happened: the broker closed the channel under the running call,
    # and the slow stage-1 message was delivered again while its call still ran.
    log = worker.log.read_text(errors="replace")
    closes = log.count("PRECONDITION_FAILED - delivery acknowledgement on channel")
    assert closes >= 1, worker.tail()
    received = re.findall(r"Task council\.stage1\[([0-9a-f-]+)\] received", log)
    redelivered = len(received) - len(set(received))
    assert redelivered >= 1, worker.tail()
    assert worker.alive(), "the worker reconnects after a channel error; it must not exit"

    # ... and was caught: one payload, one provider call per (stage, model).
    assert (payload.verdict.value, payload.exit_code) == ("fail", 1), payload.rationale
    assert payload.completed_stages == ("stage1", "stage2", "chairman")
    ctx = strict_stack.context(settings)
    assert int(ctx.client.get(ctx.keys.finalized(vid))) == 1
    assert ctx.store.get(ctx.keys.final(vid)) == payload.model_dump_json()
    calls = calls_by_key(fake_provider, vid)
    assert len(calls) == 9
    assert all(c == {"calls": 1, "completed": 1} for c in calls.values()), calls
    print(
        f"\n[consumer_timeout] {CONSUMER_TIMEOUT_MS} ms, a {SLOW_MS} ms stage-1 call: "
        f"{closes} channel(s) closed by the broker, {redelivered} stage-1 redelivery(ies) "
        f"while the call ran, 1 payload after {took:.1f} s, every call made once"
    )
