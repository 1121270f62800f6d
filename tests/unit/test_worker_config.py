"""Worker configuration: queues, tier groups, visibility timeouts, durability settings."""

from __future__ import annotations

import pytest

from shared.settings import CouncilSettings
from shared.tiers import Tier, verify_deadline_s
from worker.config import (
    GROUPS,
    HARD_GRACE_S,
    WorkerSettings,
    broker_transport_options,
    celery_config,
    group_for_tiers,
    group_of,
    longest_task_s,
    parse_tiers,
    queue_name,
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


def test_amqp_broker_gets_no_redis_transport_options():
    settings = CouncilSettings(broker_url="amqp://guest:guest@127.0.0.1:5672//")
    assert broker_transport_options("slow", settings, WorkerSettings()) == {}
    conf = celery_config("slow", settings, WorkerSettings())
    assert conf["task_acks_late"] and conf["result_backend"] == settings.redis_url


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
