"""RabbitMQ as the broker: the same council, the same payload, the queues declared as the
docs say, countdowns held in the broker, and a worker that refuses unsafe time limits.

Redis stays the store and the result backend; every stack has its own RabbitMQ vhost.
The kill tests for both brokers are in test_celery_recovery.py, the consumer-timeout test
in test_rabbitmq_consumer_timeout.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kombu import Connection

from shared.embedded import run_embedded
from shared.providers.client import HttpProviderClient, ProviderKeys
from tests.helpers import SQL_INJECTION
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    ROOT,
    CeleryStack,
    calls_by_key,
    commit_change,
    plan_for,
    wait_until,
)
from worker.celery_app import make_app
from worker.runner import run_remote

pytestmark = pytest.mark.integration
# The fixtures, for this module's tests.
rabbitmq = worker_fixtures.rabbitmq
shared_amqp_stack = worker_fixtures.shared_amqp_stack
amqp_stack = worker_fixtures.amqp_stack
celery_stack = worker_fixtures.celery_stack

IGNORED = {"verification_id", "transcript_location", "timing", "runner"}
CLI = str(Path(sys.executable).with_name("llm-council"))


class _NoFake:
    """Settings need model ids; these tests call no model."""

    @staticmethod
    def model_id(model: str) -> str:
        return f"openai-compat@http://127.0.0.1:9/v1:{model}"


def test_same_payload_on_rabbitmq_redis_and_embedded(
    shared_amqp_stack, celery_stack, fake_provider, repo
):
    """A verification through a RabbitMQ-brokered worker gives the payload a Redis-brokered
    worker and the embedded runner give (ids and timings aside)."""
    celery_stack.worker(concurrency=4).start()
    sha = commit_change(repo, SQL_INJECTION)
    payloads = {}
    for name, stack in (("amqp", shared_amqp_stack), ("redis", celery_stack)):
        settings = stack.settings(fake_provider)
        plan = plan_for(repo, settings, sha, seed=4321)
        fake_provider.reset()  # the same prompt-cache state for every run
        payloads[name] = run_remote(plan, settings, options=stack.worker_settings())
        calls = calls_by_key(fake_provider, plan.verification_id)
        assert len(calls) == 9, calls
        assert all(c == {"calls": 1, "completed": 1} for c in calls.values()), calls
    settings = shared_amqp_stack.settings(fake_provider)
    fake_provider.reset()
    client = HttpProviderClient(ProviderKeys.from_settings(settings))
    payloads["embedded"] = run_embedded(plan_for(repo, settings, sha, seed=4321), client)
    amqp = payloads["amqp"]
    assert (amqp.verdict.value, amqp.exit_code, amqp.runner) == ("fail", 1, "celery")
    assert amqp.completed_stages == ("stage1", "stage2", "chairman")
    a, r, e = (payloads[k].model_dump(mode="json", exclude=IGNORED) for k in payloads)
    assert a == r == e


def test_gate_through_a_rabbitmq_worker_matches_the_embedded_gate(shared_amqp_stack, repo):
    """`llm-council gate` with LLM_COUNCIL_BROKER_URL=amqp://... (what the README says)."""
    sha = commit_change(repo, SQL_INJECTION)
    env = shared_amqp_stack.env()
    assert env["LLM_COUNCIL_BROKER_URL"].startswith("amqp://")
    args = [CLI, "gate", "--offline", "--snapshot", sha, "--tier", "quick",
            "--output-format", "json", "--repo", str(repo.root)]  # fmt: skip
    remote = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    embedded_env = {k: v for k, v in env.items() if k != "LLM_COUNCIL_BROKER_URL"}
    embedded = subprocess.run(
        args, cwd=ROOT, env=embedded_env, capture_output=True, text=True, timeout=120
    )
    assert remote.returncode == embedded.returncode == 1, remote.stderr + embedded.stderr
    a, b = json.loads(remote.stdout), json.loads(embedded.stdout)
    assert (a["runner"], b["runner"]) == ("celery", "embedded")
    for field in ("verdict", "exit_code", "findings", "blocking_issues", "completed_stages",
                  "coverage", "unclear_reason"):  # fmt: skip
        assert a[field] == b[field], field


def test_tier_queues_are_quorum_queues_on_a_topic_exchange(shared_amqp_stack):
    stack: CeleryStack = shared_amqp_stack
    queues = {
        line.split("\t")[0]: line.split("\t")[1:]
        for line in stack.rabbitmqctl("list_queues", "name", "type", "durable").splitlines()[1:]
    }
    for name in ("council.quick", "council.balanced"):
        assert queues[name] == ["quorum", "true"], queues
    assert "council.high" not in queues  # the slow group's queues belong to its workers
    exchanges = dict(
        line.split("\t")
        for line in stack.rabbitmqctl("list_exchanges", "name", "type").splitlines()[1:]
    )
    assert exchanges["council"] == "topic"
    bindings = {
        tuple(line.split("\t"))
        for line in stack.rabbitmqctl(
            "list_bindings", "source_name", "destination_name", "routing_key"
        ).splitlines()[1:]
    }
    for name in ("council.quick", "council.balanced"):
        assert ("council", name, name) in bindings
        # Celery's native delayed delivery routes a countdown back through the exchange.
        assert ("celery_delayed_delivery", "council", f"#.{name}") in bindings
    log = stack.workers[0].log.read_text(errors="replace")
    assert "direct exchange" not in log and "Global QoS is disabled" in log


def test_a_retry_countdown_waits_in_the_broker_and_keeps_its_tier_queue(
    shared_amqp_stack, fake_provider
):
    """A retried task (countdown 2 s) waits in RabbitMQ's delayed-delivery queues, not in a
    worker's memory, and comes back on the queue it came from (not the default queue)."""
    stack: CeleryStack = shared_amqp_stack
    settings = stack.settings(fake_provider)
    app = make_app("fast", settings, stack.worker_settings())
    t0 = time.time()
    result = app.signature("council.bench.route", args=(2.0,), queue="council.balanced").delay()

    def delayed() -> int:
        """Messages in the delayed-delivery queues (a passive declare counts them live;
        `rabbitmqctl list_queues` shows statistics up to 5 s old)."""
        with Connection(stack.broker, connect_timeout=3) as conn:
            channel = conn.default_channel
            return sum(
                channel.queue_declare(queue=f"celery_delayed_{level}", passive=True).message_count
                for level in range(28)
            )

    assert wait_until(delayed, 5, "the retry to wait in a delayed-delivery queue", step=0.05)
    reply = result.get(timeout=20)
    elapsed = time.time() - t0
    assert reply["retries"] == 1
    assert reply["routing_key"].endswith(".council.balanced"), reply
    assert 2.0 <= elapsed < 10.0
    result.forget()


def test_worker_refuses_to_start_when_a_task_could_outlive_consumer_timeout(shared_amqp_stack):
    stack: CeleryStack = shared_amqp_stack
    env = stack.env(
        LLM_COUNCIL_WORKER_TIERS="quick,balanced",
        LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S="120",
    )
    argv = [
        *stack.workers[0].argv()[:6],
        "-Q", "council.quick,council.balanced", "-c", "1", "-n", "refused@%h",
    ]  # fmt: skip
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("llm-council worker:")]
    assert len(lines) == 1, out.stderr[-2000:]
    line = lines[0]
    assert "balanced-tier task" in line and "215 s" in line  # 180 s deadline + 5 s + 30 s
    assert "consumer_timeout of 120 s" in line and "LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S" in line
    assert "Connected to" not in out.stdout + out.stderr  # it never consumed anything


def test_messages_published_before_any_worker_wait_in_declared_queues(amqp_stack):
    """A runner publishing into a fresh vhost declares the tier queues itself (quorum, on
    the topic exchange): nothing is dropped as unroutable before a worker ever started.
    The metrics exporter counts them."""
    from worker.celery_app import get_app
    from worker.metrics import queue_depths

    stack: CeleryStack = amqp_stack
    settings = stack.settings(_NoFake())
    ws = stack.worker_settings()
    app = get_app("fast", settings, ws)
    for _ in range(3):
        app.send_task("council.bench.noop", queue="council.quick")
    app.send_task("council.bench.noop", queue="council.balanced")
    depths = queue_depths(settings, ws)
    assert depths["fast"]["up"] is True
    assert depths["fast"]["queues"] == {"council.quick": 3, "council.balanced": 1}
    assert depths["slow"]["queues"] == {"council.high": 0, "council.reasoning": 0}
    assert depths["fast"]["unacked"] is None  # a Redis-broker gauge
    types = dict(
        line.split("\t") for line in stack.rabbitmqctl("list_queues", "name", "type").splitlines()
    )
    assert types["council.quick"] == types["council.balanced"] == "quorum"


def test_broker_unreachable_at_enqueue_is_one_clear_line(celery_stack, repo):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    sha = commit_change(repo, SQL_INJECTION)
    env = celery_stack.env(LLM_COUNCIL_BROKER_URL=f"amqp://guest:secret@127.0.0.1:{closed}//")
    out = subprocess.run(
        [CLI, "gate", "--offline", "--snapshot", sha, "--repo", str(repo.root)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(
        f"llm-council: cannot reach the Celery broker at amqp://guest:***@127.0.0.1:{closed}//"
    )
    assert "secret" not in out.stderr and out.stdout == ""
    assert celery_stack.own_keys() == []
