"""Worker configuration: queues, tier groups, visibility timeouts, durability settings."""

from __future__ import annotations

import pytest

from shared.settings import CouncilSettings
from shared.tiers import Tier, verify_deadline_s
from worker.config import (
    GROUPS,
    HARD_GRACE_S,
    WorkerSettings,
    broker_kind,
    broker_transport_options,
    celery_config,
    consumer_timeout_problem,
    group_for_tiers,
    group_of,
    longest_task_s,
    parse_tiers,
    queue_name,
    queue_of_routing_key,
    recovery_bound_s,
    redact_url,
    tier_table,
    visibility_timeout,
)
from worker.keys import Keys


def _settings(**kw) -> CouncilSettings:
    return CouncilSettings(broker_url="redis://127.0.0.1:6379/0", **kw)


def test_each_tier_has_its_own_queue_and_one_group():
    assert [queue_name(t) for t in Tier] == [
        "council.quick", "council.balanced", "council.high", "council.reasoning"
    ]  # fmt: skip
    assert {t for ts in GROUPS.values() for t in ts} == set(Tier)
    assert group_of(Tier.QUICK) == group_of(Tier.BALANCED) == "fast"
    assert group_of(Tier.HIGH) == group_of(Tier.REASONING) == "slow"


def test_parse_tiers_and_group_errors_name_the_problem():
    assert parse_tiers("quick, balanced") == (Tier.QUICK, Tier.BALANCED)
    assert group_for_tiers(parse_tiers("reasoning")) == "slow"
    with pytest.raises(ValueError, match="span two tier groups"):
        group_for_tiers(parse_tiers("quick,high"))
    with pytest.raises(ValueError, match="unknown tier 'fastest'"):
        parse_tiers("fastest")
    with pytest.raises(ValueError, match="no tier given"):
        parse_tiers(" , ")


@pytest.mark.parametrize("multiplier", [0.5, 1.0, 3.0])
def test_visibility_timeout_exceeds_every_task_of_the_group(multiplier):
    settings = _settings(timeout_multiplier=multiplier)
    ws = WorkerSettings()
    for group, tiers in GROUPS.items():
        vt = visibility_timeout(group, settings, ws)
        for tier in tiers:
            longest = longest_task_s(tier, multiplier)
            assert longest == verify_deadline_s(tier, multiplier) + HARD_GRACE_S
            assert vt > longest + 10  # room for the wait in a worker and clock skew
            assert recovery_bound_s(tier, settings, ws) == vt + ws.unacked_restore_interval


def test_production_values_per_group():
    settings, ws = _settings(), WorkerSettings()
    assert visibility_timeout("fast", settings, ws) == 215.0
    assert visibility_timeout("slow", settings, ws) == 1235.0
    rows = {r["tier"]: r for r in tier_table(settings, ws)}
    assert rows["quick"]["recovery_bound_s"] == rows["balanced"]["recovery_bound_s"] == 220.0
    assert rows["reasoning"]["recovery_bound_s"] == 1240.0


def test_explicit_visibility_timeout_wins():
    ws = WorkerSettings(visibility_timeout_fast=4, visibility_timeout_slow=9)
    assert visibility_timeout("fast", _settings(), ws) == 4
    assert visibility_timeout("slow", _settings(), ws) == 9


def test_celery_config_is_durable_json_only_and_evented():
    conf = celery_config("fast", _settings(), WorkerSettings())
    assert conf["task_acks_late"] is True
    assert conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["task_serializer"] == conf["result_serializer"] == "json"
    assert conf["accept_content"] == conf["result_accept_content"] == ["json"]
    assert conf["worker_send_task_events"] and conf["task_send_sent_event"]
    assert conf["worker_pool"] == "prefork"
    assert [q.name for q in conf["task_queues"]] == ["council.quick", "council.balanced"]
    opts = conf["broker_transport_options"]
    assert opts["visibility_timeout"] == 215.0
    assert opts["unacked_restore_throttle"] == 1
    assert opts["global_keyprefix"] == "fast:"


def test_groups_get_separate_broker_namespaces():
    ws = WorkerSettings(broker_key_prefix="x:")
    fast = broker_transport_options("fast", _settings(), ws)
    slow = broker_transport_options("slow", _settings(), ws)
    assert (fast["global_keyprefix"], slow["global_keyprefix"]) == ("x:fast:", "x:slow:")
    ws2 = WorkerSettings(broker_url_slow="redis://other:6379/3")
    assert celery_config("slow", _settings(), ws2)["broker_url"] == "redis://other:6379/3"


AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def test_amqp_broker_gets_publisher_confirms_and_no_redis_transport_options():
    settings = CouncilSettings(broker_url=AMQP)
    assert broker_transport_options("slow", settings, WorkerSettings()) == {"confirm_publish": True}
    conf = celery_config("slow", settings, WorkerSettings())
    assert conf["task_acks_late"] and conf["result_backend"] == settings.redis_url
    assert conf["task_reject_on_worker_lost"] and conf["worker_prefetch_multiplier"] == 1


@pytest.mark.parametrize("url", [AMQP, "amqps://u:p@mq:5671/council", "pyamqp://mq//"])
def test_amqp_tier_queues_are_quorum_queues_on_one_topic_exchange(url):
    conf = celery_config("slow", CouncilSettings(broker_url=url), WorkerSettings())
    queues = conf["task_queues"]
    assert [q.name for q in queues] == ["council.high", "council.reasoning"]
    for q in queues:
        assert q.queue_arguments == {"x-queue-type": "quorum"}  # no x-max-priority
        assert q.durable and not q.auto_delete and not q.exclusive
        assert (q.exchange.name, q.exchange.type, q.exchange.durable) == ("council", "topic", True)
        assert q.routing_key == q.name
    assert conf["task_create_missing_queues"] is False
    assert (conf["task_default_exchange"], conf["task_default_exchange_type"]) == (
        "council",
        "topic",
    )
    assert conf["worker_detect_quorum_queues"] is True
    assert conf["broker_native_delayed_delivery_queue_type"] == "quorum"
    assert 10 <= conf["broker_heartbeat"] <= 30


def test_redis_queues_stay_classic_on_direct_exchanges():
    conf = celery_config("fast", _settings(), WorkerSettings())
    for q in conf["task_queues"]:
        assert not q.queue_arguments
        assert (q.exchange.name, q.exchange.type) == (q.name, "direct")


@pytest.mark.parametrize("broker", ["redis://127.0.0.1:6379/0", AMQP])
def test_time_limit_backstop_is_the_groups_longest_task(broker):
    settings = CouncilSettings(broker_url=broker)
    for group, tiers in GROUPS.items():
        conf = celery_config(group, settings, WorkerSettings())
        longest = max(longest_task_s(t) for t in tiers)
        assert conf["task_time_limit"] == longest
        assert conf["task_soft_time_limit"] == longest - HARD_GRACE_S


@pytest.mark.parametrize("multiplier", [0.5, 1.0, 1.4])
def test_default_consumer_timeout_fits_every_tier(multiplier):
    """With RabbitMQ's default consumer_timeout (30 min) every worker starts, up to a
    timeout multiplier of about 1.45; each task ends well before the broker gives up."""
    settings = CouncilSettings(broker_url=AMQP, timeout_multiplier=multiplier)
    ws = WorkerSettings()
    assert ws.rabbitmq_consumer_timeout_s == 1800
    for group, tiers in GROUPS.items():
        assert consumer_timeout_problem(group, settings, ws) is None
        for tier in tiers:
            assert longest_task_s(tier, multiplier) + 30 < ws.rabbitmq_consumer_timeout_s


def test_a_consumer_timeout_below_a_hard_limit_is_refused_with_one_clear_line():
    ws = WorkerSettings(rabbitmq_consumer_timeout_s=600)
    settings = CouncilSettings(broker_url=AMQP)
    assert consumer_timeout_problem("fast", settings, ws) is None  # 185 s + 30 s < 600 s
    problem = consumer_timeout_problem("slow", settings, ws)
    assert problem is not None and "\n" not in problem
    assert "reasoning-tier task" in problem and "1235 s" in problem
    assert "consumer_timeout of 600 s" in problem
    assert "consumer_timeout = 1800000" in problem  # the next whole 10 minutes above
    assert "LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S=1800" in problem
    # A larger multiplier pushes the reasoning tier past the default 30 minutes.
    slow = CouncilSettings(broker_url=AMQP, timeout_multiplier=1.5)
    assert "1835 s" in (consumer_timeout_problem("slow", slow, WorkerSettings()) or "")
    # Redis has no consumer timeout: never refused for it.
    assert consumer_timeout_problem("slow", _settings(timeout_multiplier=3), ws) is None


def test_consumer_timeout_and_heartbeat_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S", "3600")
    monkeypatch.setenv("LLM_COUNCIL_BROKER_HEARTBEAT_S", "20")
    ws = WorkerSettings()
    assert (ws.rabbitmq_consumer_timeout_s, ws.broker_heartbeat_s) == (3600, 20)
    conf = celery_config("fast", CouncilSettings(broker_url=AMQP), ws)
    assert conf["broker_heartbeat"] == 20


def test_broker_kind_by_scheme():
    assert broker_kind("redis://h:6379/0") == broker_kind("rediss://h/0") == "redis"
    assert broker_kind(AMQP) == broker_kind("amqps://h//") == broker_kind("pyamqp://h//")
    assert broker_kind(AMQP) == "amqp"
    assert broker_kind("memory://") == "other"


@pytest.mark.parametrize(
    ("key", "queue"),
    [
        ("council.balanced", "council.balanced"),
        ("0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.council.high", "council.high"),
        ("council.reasoning", "council.reasoning"),
        ("celery", None),
        ("", None),
        (None, None),
    ],
)
def test_queue_of_routing_key_strips_delayed_delivery_bits(key, queue):
    assert queue_of_routing_key(key) == queue


def test_a_retry_goes_back_to_its_tier_queue_not_the_default_queue():
    """Celery would route a countdown retry on quorum queues by the default queue's key."""
    import worker.tasks  # noqa: F401  (registers the shared tasks)
    from worker.celery_app import make_app

    app = make_app("slow", CouncilSettings(broker_url=AMQP), WorkerSettings())
    task = app.tasks["council.stage1"]
    delayed = "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.council.reasoning"
    for key in ("council.reasoning", delayed):
        request = type(
            "Req",
            (),
            {
                "args": ("vid", "m", 1.0),
                "kwargs": {},
                "delivery_info": {"exchange": "council", "routing_key": key},
                "as_execution_options": lambda self: {},
                "ignore_result": False,
            },
        )()
        sig = task.signature_from_request(request)
        assert sig.options["queue"] == "council.reasoning", key


def test_redact_url_hides_passwords():
    assert redact_url("redis://:hunter2@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("amqp://user:pw@mq:5672//") == "amqp://user:***@mq:5672//"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_every_key_shares_the_prefix_and_is_distinct():
    keys = Keys("p:")
    names = [
        keys.plan("v"), keys.state("v"), keys.done("v", "stage1"), keys.events("v"),
        keys.result("v", "stage1", "m"), keys.lease("v", "stage1", "m"), keys.final("v"),
        keys.final_lease("v"), keys.files("v"), keys.finalized("v"), keys.deadlines,
        keys.plans,
    ]  # fmt: skip
    assert all(n.startswith("p:") for n in names)
    assert len(set(names)) == len(names)
    assert keys.result("v", "stage1", "m") != keys.result("v", "stage2", "m")
