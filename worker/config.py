"""Celery configuration for the council workflow, per tier group.

Tiers run on their own queues (`council.quick`, `council.balanced`, `council.high`,
`council.reasoning`) so a 20-minute reasoning review never starves a quick one. Queues are
served by two *tier groups*, each with its own broker namespace and its own Redis
visibility timeout:

| group | tiers | queues |
|---|---|---|
| `fast` | quick, balanced | `council.quick`, `council.balanced` |
| `slow` | high, reasoning | `council.high`, `council.reasoning` |

Why groups: on the Redis broker the visibility timeout is a property of the connection, not
of a queue, and every consumer of a namespace restores *every* unacked message older than
its own timeout. A quick worker with a short timeout would therefore redeliver a running
reasoning task. Each group gets its own namespace (kombu `global_keyprefix`
`<LLM_COUNCIL_BROKER_KEY_PREFIX><group>:` on the same Redis by default, or another database
or server with `LLM_COUNCIL_BROKER_URL_SLOW`) and a timeout sized for its longest tier:

    visibility_timeout(group) = max verify deadline of its tiers (x timeout multiplier)
                                + HARD_GRACE_S + QUEUE_WAIT_MARGIN_S

No task can run longer than that: every task's hard time limit ends it by the verify
deadline plus HARD_GRACE_S (see `worker.canvas`), and with prefetch 1 a message waits in a
worker only until a pool process is free. A whole worker killed with SIGKILL gets its
messages back after the visibility timeout plus one restore scan
(`unacked_restore_interval`, scanned every time: `unacked_restore_throttle=1`).

The broker is chosen by `LLM_COUNCIL_BROKER_URL` alone; Redis stays the result backend, the
stage store and the lease holder (`LLM_COUNCIL_REDIS_URL`) whatever the broker. Nothing
broker-specific leaks out of this module, and the task code never looks at the broker:

- `redis://...`: the group namespaces and visibility timeouts above, classic queues on
  direct exchanges (kombu's virtual AMQP).
- `amqp://...` (RabbitMQ): no visibility timeout. The broker redelivers a consumer's
  unacknowledged messages the moment its connection closes, so a killed worker's tasks
  come back in milliseconds. The tier queues are quorum queues (replicated, durable,
  delivery counted) bound to one topic exchange, `council`, so Celery's native delayed
  delivery keeps countdowns (task retries) in the broker rather than in a worker's memory.
  Quorum queues have no per-message priority (`x-max-priority` is refused): nothing here
  uses priorities; tiers are separated by queue instead. Publisher confirms are on, and
  worker connections send heartbeats (`LLM_COUNCIL_BROKER_HEARTBEAT_S`, default 10 s), so
  a frozen worker's messages return after about three intervals.
  RabbitMQ's own limit is `consumer_timeout` (default 30 min): a message unacknowledged for
  longer gets its channel closed and is redelivered while the task may still run. Every
  task's hard limit ends it by its verification's deadline plus HARD_GRACE_S, and a worker
  refuses to start when that, plus QUEUE_WAIT_MARGIN_S, does not fit in the consumer
  timeout it was told about (`LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S`, see
  `consumer_timeout_problem`).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import CouncilSettings
from shared.tiers import TIER_SPECS, Tier, parse_tier, verify_deadline_s
from worker.keys import LEASE_HEARTBEAT_S, LEASE_TTL_S

GROUPS: dict[str, tuple[Tier, ...]] = {
    "fast": (Tier.QUICK, Tier.BALANCED),
    "slow": (Tier.HIGH, Tier.REASONING),
}
QUEUE_PREFIX = "council."

#: A task's hard time limit is its soft limit plus this; the chairman uses it to finish
#: writing a partial payload after its soft limit fired.
HARD_GRACE_S = 5.0
#: The chairman's soft limit fires this long before the verify deadline, so the partial
#: payload is written by the deadline (less than the verdict engine's 0.25 s slack, and less
#: than the 0.2 s a fallback chairman would need to start).
SOFT_LEAD_S = 0.1
#: A stage task's soft limit fires this long after its stage's end (the same grace the
#: embedded runner gives a stage's futures); the provider client already stops at the end.
STAGE_GRACE_S = 2.0
#: Head-room in the visibility timeout for a message held by a worker before a pool
#: process takes it (prefetch 1 keeps that short) and for clock skew between hosts.
QUEUE_WAIT_MARGIN_S = 30.0
#: A chairman published after the deadline only salvages what is stored: these limits
#: bound it (a chairman published in time gets limits from the budget left).
DISPATCH_TIME_LIMIT_S = 60.0
#: Default seconds between kombu restore scans (with the throttle at 1: every interval).
RESTORE_INTERVAL_S = 5.0
#: Default prefork pool size: calls are I/O-bound, a council of four needs four slots.
DEFAULT_CONCURRENCY = 8

REDIS_SCHEMES = ("redis", "rediss", "sentinel", "redis+socket", "unix")
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
#: The one topic exchange every tier queue is bound to on RabbitMQ (routing key = queue).
AMQP_EXCHANGE = "council"
#: RabbitMQ's default `consumer_timeout` (30 min), what a worker assumes unless told.
RABBITMQ_DEFAULT_CONSUMER_TIMEOUT_S = 1800.0
#: AMQP heartbeat of worker connections: a frozen (SIGSTOPped, hung) worker's connection is
#: closed by the broker after about three intervals, and its messages redelivered.
BROKER_HEARTBEAT_S = 10


class WorkerSettings(BaseSettings):
    """Settings of the Celery side (runner, workers, watchdog), from `LLM_COUNCIL_*`."""

    model_config = SettingsConfigDict(env_prefix="LLM_COUNCIL_", extra="ignore", frozen=True)

    #: Prefix of every key in `worker.keys` (stage store, state, payloads, watchdog list),
    #: and of the result backend's keys (`<prefix>celery:`).
    key_prefix: str = "llmc:"
    #: Prefix of the broker namespaces; each group adds `<group>:` to it.
    broker_key_prefix: str = ""
    #: Broker for the slow group; defaults to LLM_COUNCIL_BROKER_URL.
    broker_url_slow: str | None = None
    #: Explicit visibility timeouts in seconds (default: derived from the tier deadlines).
    visibility_timeout_fast: float | None = Field(default=None, gt=0)
    visibility_timeout_slow: float | None = Field(default=None, gt=0)
    unacked_restore_interval: float = Field(default=RESTORE_INTERVAL_S, gt=0)
    lease_ttl_s: float = Field(default=LEASE_TTL_S, gt=0)
    lease_heartbeat_s: float = Field(default=LEASE_HEARTBEAT_S, gt=0)
    #: A waiting runner gives the workflow this long past the deadline, then runs the
    #: watchdog for its verification.
    wait_grace_s: float = Field(default=3.0, ge=0)
    #: Warm shutdown with REMAP_SIGTERM=SIGQUIT: seconds in-flight tasks get to finish
    #: before the worker cancels them and hands their messages back.
    soft_shutdown_timeout: float = Field(default=0.0, ge=0)
    #: RabbitMQ only: the broker's `consumer_timeout` in seconds (what its rabbitmq.conf
    #: says, in ms there). A worker refuses to start if a task could outlive it.
    rabbitmq_consumer_timeout_s: float = Field(default=RABBITMQ_DEFAULT_CONSUMER_TIMEOUT_S, gt=0)
    #: RabbitMQ only: heartbeat of worker connections (0 disables; keep it 10-30 s).
    broker_heartbeat_s: int = Field(default=BROKER_HEARTBEAT_S, ge=0, le=300)


def queue_name(tier: Tier) -> str:
    return f"{QUEUE_PREFIX}{tier.value}"


def queue_of_routing_key(routing_key: str | None) -> str | None:
    """The tier queue a delivered message was routed to, from its routing key.

    A message that waited in RabbitMQ's delayed-delivery queues (a countdown) arrives with
    the delay's bits in front of the queue name (`0.1.0....council.high`)."""
    if not routing_key:
        return None
    for tier in Tier:
        name = queue_name(tier)
        if routing_key == name or routing_key.endswith(f".{name}"):
            return name
    return None


def group_of(tier: Tier) -> str:
    for name, tiers in GROUPS.items():
        if tier in tiers:
            return name
    raise ValueError(f"tier {tier} belongs to no group")  # pragma: no cover


def parse_tiers(text: str) -> tuple[Tier, ...]:
    """`quick,balanced` -> tiers; raises ValueError naming a bad tier."""
    tiers = tuple(dict.fromkeys(parse_tier(p) for p in text.split(",") if p.strip()))
    if not tiers:
        raise ValueError("no tier given; expected e.g. --tiers quick,balanced")
    return tiers


def group_for_tiers(tiers: tuple[Tier, ...]) -> str:
    """The one group serving all of `tiers`; ValueError if they span two groups."""
    groups = {group_of(t) for t in tiers}
    if len(groups) != 1:
        listing = "; ".join(f"{g}: {','.join(t.value for t in ts)}" for g, ts in GROUPS.items())
        raise ValueError(
            f"tiers {','.join(t.value for t in tiers)} span two tier groups with different "
            f"visibility timeouts ({listing}); start one worker per group"
        )
    return groups.pop()


def is_redis_url(url: str) -> bool:
    return urlsplit(url).scheme in REDIS_SCHEMES


def is_amqp_url(url: str) -> bool:
    return urlsplit(url).scheme in AMQP_SCHEMES


def broker_kind(url: str) -> str:
    """`redis`, `amqp` or `other` (e.g. `memory://` in unit tests)."""
    return "redis" if is_redis_url(url) else "amqp" if is_amqp_url(url) else "other"


def redact_url(url: str) -> str:
    """The URL with any password replaced, fit for an error message or a log line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def longest_task_s(tier: Tier, multiplier: float = 1.0) -> float:
    """The longest any task of `tier` can run: its hard limit ends it by the deadline."""
    return verify_deadline_s(tier, multiplier) + HARD_GRACE_S


def visibility_timeout(group: str, settings: CouncilSettings, ws: WorkerSettings) -> float:
    explicit = ws.visibility_timeout_fast if group == "fast" else ws.visibility_timeout_slow
    if explicit is not None:
        return explicit
    longest = max(longest_task_s(t, settings.timeout_multiplier) for t in GROUPS[group])
    return longest + QUEUE_WAIT_MARGIN_S


def recovery_bound_s(tier: Tier, settings: CouncilSettings, ws: WorkerSettings) -> float:
    """Worst case from a whole-worker SIGKILL until its tasks are queued again (Redis)."""
    return visibility_timeout(group_of(tier), settings, ws) + ws.unacked_restore_interval


def group_hard_limit_s(group: str, settings: CouncilSettings) -> float:
    """The longest any task of the group can run (its slowest tier's hard limit)."""
    return max(longest_task_s(t, settings.timeout_multiplier) for t in GROUPS[group])


def consumer_timeout_problem(
    group: str, settings: CouncilSettings, ws: WorkerSettings
) -> str | None:
    """Why a worker of `group` must not start on its broker, or None if it may.

    On RabbitMQ a message must be acknowledged within `consumer_timeout` of its delivery,
    or the broker closes the channel and hands the message to another consumer while the
    task still runs. A task is acknowledged when it ends (late acks), and it ends by its
    hard limit; with prefetch 1 it waits in the worker at most QUEUE_WAIT_MARGIN_S first.
    """
    url = broker_url_for(group, settings, ws)
    if not is_amqp_url(url):
        return None
    needed = group_hard_limit_s(group, settings) + QUEUE_WAIT_MARGIN_S
    timeout = ws.rabbitmq_consumer_timeout_s
    if needed < timeout:
        return None
    slowest = max(GROUPS[group], key=lambda t: longest_task_s(t, settings.timeout_multiplier))
    suggested = math.ceil((needed + 1) / 600) * 600  # the next whole 10 minutes
    return (
        f"refusing to start: a {slowest.value}-tier task may hold its RabbitMQ message for "
        f"{needed:.0f} s (hard limit {group_hard_limit_s(group, settings):.0f} s + "
        f"{QUEUE_WAIT_MARGIN_S:.0f} s queue wait), not below the broker's consumer_timeout "
        f"of {timeout:.0f} s (LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S), so RabbitMQ could "
        f"redeliver it while it runs; set consumer_timeout = {suggested * 1000} in "
        f"rabbitmq.conf and LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S={suggested}, or lower "
        "LLM_COUNCIL_TIMEOUT_MULTIPLIER"
    )


def broker_url_for(group: str, settings: CouncilSettings, ws: WorkerSettings) -> str:
    if not settings.broker_url:
        raise ValueError("no broker configured: set LLM_COUNCIL_BROKER_URL")
    if group == "slow" and ws.broker_url_slow:
        return ws.broker_url_slow
    return settings.broker_url


def broker_prefix_for(group: str, ws: WorkerSettings) -> str:
    return f"{ws.broker_key_prefix}{group}:"


def result_prefix(ws: WorkerSettings) -> str:
    return f"{ws.key_prefix}celery:"


def broker_transport_options(
    group: str, settings: CouncilSettings, ws: WorkerSettings
) -> dict[str, Any]:
    url = broker_url_for(group, settings, ws)
    if is_amqp_url(url):
        # Every publish waits for the broker's ack: a message the broker refused (or lost
        # while failing over) raises at the publisher instead of vanishing.
        return {"confirm_publish": True}
    if not is_redis_url(url):
        return {}
    return {
        "visibility_timeout": visibility_timeout(group, settings, ws),
        "unacked_restore_interval": ws.unacked_restore_interval,
        "unacked_restore_throttle": 1,
        "global_keyprefix": broker_prefix_for(group, ws),
        "socket_connect_timeout": 5,
        "socket_timeout": 30,
        "health_check_interval": 25,
    }


def tier_queues(group: str, url: str) -> list[Any]:
    """The group's queues, declared the way the broker at `url` needs them.

    RabbitMQ: durable quorum queues bound to the `council` topic exchange (routing key =
    queue name). Quorum, because they are replicated and survive a node restart, and Celery
    detects them and switches to per-consumer prefetch; topic, because Celery's native
    delayed delivery re-routes a countdown message by its routing key (direct exchanges
    would make a worker hold retries in memory). No `x-max-priority`: quorum queues refuse
    it. Redis (and others): one direct exchange per queue, as kombu's virtual AMQP expects.
    """
    from kombu import Exchange, Queue

    names = [queue_name(t) for t in GROUPS[group]]
    if is_amqp_url(url):
        exchange = Exchange(AMQP_EXCHANGE, type="topic", durable=True)
        return [
            Queue(
                name,
                exchange,
                routing_key=name,
                durable=True,
                queue_arguments={"x-queue-type": "quorum"},
            )
            for name in names
        ]
    return [Queue(name, Exchange(name, type="direct"), routing_key=name) for name in names]


def celery_config(group: str, settings: CouncilSettings, ws: WorkerSettings) -> dict[str, Any]:
    """The Celery configuration of one tier group (a plain dict for `app.conf.update`)."""
    url = broker_url_for(group, settings, ws)
    queues = tier_queues(group, url)
    hard = group_hard_limit_s(group, settings)
    result_opts: dict[str, Any] = {"global_keyprefix": result_prefix(ws)}
    return {
        "broker_url": url,
        "broker_transport_options": broker_transport_options(group, settings, ws),
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 5,
        # AMQP only (other transports ignore it): worker connections send heartbeats, so
        # the broker notices a frozen worker and redelivers its messages. Publisher
        # connections (the runner) keep none: nothing would service them between publishes.
        "broker_heartbeat": ws.broker_heartbeat_s,
        # Quorum queues: per-consumer prefetch (no global QoS), countdowns held in the
        # broker's delayed-delivery queues (both Celery defaults, stated here on purpose).
        "worker_detect_quorum_queues": True,
        "broker_native_delayed_delivery_queue_type": "quorum",
        "result_backend": settings.redis_url,
        "result_backend_transport_options": result_opts,
        "result_expires": 24 * 3600,
        "result_chord_ordered": True,
        # JSON only, on both directions.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        # Durability: a message is acknowledged after its task ran; a task whose process
        # died is handed back to the queue; one message per pool process at a time.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_acks_on_failure_or_timeout": True,
        # A broker connection loss must not cancel a running call: its stage store lease
        # makes the redelivered copy wait for it instead of paying twice.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Events for Flower.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # Prefork: the only pool that enforces soft time limits.
        "worker_pool": "prefork",
        "worker_concurrency": DEFAULT_CONCURRENCY,
        "worker_soft_shutdown_timeout": ws.soft_shutdown_timeout,
        "worker_enable_soft_shutdown_on_idle": ws.soft_shutdown_timeout > 0,
        "task_queues": queues,
        "task_default_queue": queues[0].name,
        "task_default_exchange": queues[0].exchange.name,
        "task_default_exchange_type": queues[0].exchange.type,
        "task_default_routing_key": queues[0].routing_key,
        "task_create_missing_queues": False,
        # A backstop for a message that carries no limits of its own: every council task
        # carries tighter ones (see worker.canvas). On RabbitMQ the hard limit stays below
        # consumer_timeout (a worker refuses to start otherwise).
        "task_time_limit": hard,
        "task_soft_time_limit": hard - HARD_GRACE_S,
        "broker_channel_error_retry": True,
        "task_track_started": False,
        "worker_disable_rate_limits": True,
    }


def tier_table(settings: CouncilSettings, ws: WorkerSettings) -> list[dict[str, Any]]:
    """Per tier: queue, group, deadline, visibility timeout and recovery bound (for docs)."""
    rows = []
    for tier in Tier:
        group = group_of(tier)
        rows.append(
            {
                "tier": tier.value,
                "queue": queue_name(tier),
                "group": group,
                "deadline_s": verify_deadline_s(tier, settings.timeout_multiplier),
                "per_call_cap_s": TIER_SPECS[tier].per_call_cap_s * settings.timeout_multiplier,
                "longest_task_s": longest_task_s(tier, settings.timeout_multiplier),
                "visibility_timeout_s": visibility_timeout(group, settings, ws),
                "recovery_bound_s": recovery_bound_s(tier, settings, ws),
            }
        )
    return rows
