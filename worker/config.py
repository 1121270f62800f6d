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

Nothing Redis-specific leaks out of this module: for an `amqp://` broker the transport
options are simply not set (RabbitMQ redelivers on connection loss and has no visibility
timeout), and the task code never looks at the broker.
"""

from __future__ import annotations

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


def queue_name(tier: Tier) -> str:
    return f"{QUEUE_PREFIX}{tier.value}"


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
    if not is_redis_url(broker_url_for(group, settings, ws)):
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


def celery_config(group: str, settings: CouncilSettings, ws: WorkerSettings) -> dict[str, Any]:
    """The Celery configuration of one tier group (a plain dict for `app.conf.update`)."""
    from kombu import Exchange, Queue

    queues = [
        Queue(queue_name(t), Exchange(queue_name(t), type="direct"), routing_key=queue_name(t))
        for t in GROUPS[group]
    ]
    result_opts: dict[str, Any] = {"global_keyprefix": result_prefix(ws)}
    return {
        "broker_url": broker_url_for(group, settings, ws),
        "broker_transport_options": broker_transport_options(group, settings, ws),
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 5,
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
        "task_create_missing_queues": False,
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
