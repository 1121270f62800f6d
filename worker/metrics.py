"""Prometheus metrics Flower does not have: queue depth per tier queue.

`render(settings, ws)` returns the text exposition; `collector(settings, ws)` is a
prometheus_client collector another app (the HTTP API) can register on its own registry;
`serve(...)` is the small exporter behind `llm-council metrics`.

Gauges (computed on each scrape):
- `llm_council_queue_depth{queue, group}`: messages waiting in the tier queue (a passive
  queue declare, so it works on any kombu broker);
- `llm_council_queue_unacked{group}`: messages delivered to a worker and not yet
  acknowledged (Redis broker only: the size of kombu's unacked index);
- `llm_council_verifications_active`: submitted, not yet finalized;
- `llm_council_verifications_overdue`: past their deadline without a payload (the
  watchdog's backlog);
- `llm_council_metrics_up{target}`: 1 when the broker or the store answered the scrape.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from shared.settings import CouncilSettings
from worker.config import (
    GROUPS,
    WorkerSettings,
    broker_prefix_for,
    broker_transport_options,
    broker_url_for,
    is_redis_url,
    queue_name,
)
from worker.keys import Keys

log = logging.getLogger(__name__)


def queue_depths(settings: CouncilSettings, ws: WorkerSettings) -> dict[str, dict[str, Any]]:
    """group -> {"up": bool, "queues": {queue: depth}, "unacked": int | None}."""
    from kombu import Connection

    out: dict[str, dict[str, Any]] = {}
    for group, tiers in GROUPS.items():
        url = broker_url_for(group, settings, ws)
        info: dict[str, Any] = {"up": False, "queues": {}, "unacked": None}
        options = broker_transport_options(group, settings, ws)
        try:
            with Connection(url, transport_options=options, connect_timeout=3) as conn:
                channel = conn.default_channel
                for tier in tiers:
                    name = queue_name(tier)
                    if is_redis_url(url):
                        # kombu's passive declare checks EXISTS without the global key
                        # prefix; its own size count applies the prefix (and priorities).
                        info["queues"][name] = int(channel._size(name))
                        continue
                    try:
                        declared = channel.queue_declare(queue=name, passive=True)
                        info["queues"][name] = int(declared.message_count)
                    except Exception:  # an AMQP queue no worker declared yet
                        info["queues"][name] = 0
                        channel = conn.channel()
                info["up"] = True
            if is_redis_url(url):
                info["unacked"] = _redis_unacked(url, broker_prefix_for(group, ws))
        except Exception as exc:
            log.warning("metrics: broker of group %s unreachable: %s", group, exc)
        out[group] = info
    return out


def _redis_unacked(url: str, prefix: str) -> int | None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        return int(client.zcard(f"{prefix}unacked_index"))
    except Exception:
        return None
    finally:
        client.close()


def verification_counts(settings: CouncilSettings, ws: WorkerSettings) -> tuple[int, int] | None:
    import redis

    keys = Keys(ws.key_prefix)
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=3, socket_timeout=3)
    try:
        pipe = client.pipeline()
        pipe.zcard(keys.deadlines)
        pipe.zcount(keys.deadlines, "-inf", time.time())
        active, overdue = pipe.execute()
        return int(active), int(overdue)
    except Exception as exc:
        log.warning("metrics: store unreachable: %s", exc)
        return None
    finally:
        client.close()


class QueueCollector:
    def __init__(self, settings: CouncilSettings, ws: WorkerSettings) -> None:
        self.settings = settings
        self.ws = ws

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily(
            "llm_council_queue_depth",
            "Messages waiting in a tier queue.",
            labels=["queue", "group"],
        )
        unacked = GaugeMetricFamily(
            "llm_council_queue_unacked",
            "Messages delivered to workers and not yet acknowledged (Redis broker).",
            labels=["group"],
        )
        up = GaugeMetricFamily(
            "llm_council_metrics_up", "1 when the target answered.", labels=["target"]
        )
        for group, info in queue_depths(self.settings, self.ws).items():
            up.add_metric([f"broker:{group}"], 1.0 if info["up"] else 0.0)
            for queue, count in info["queues"].items():
                depth.add_metric([queue, group], float(count))
            if info["unacked"] is not None:
                unacked.add_metric([group], float(info["unacked"]))
        counts = verification_counts(self.settings, self.ws)
        up.add_metric(["store"], 0.0 if counts is None else 1.0)
        yield depth
        yield unacked
        if counts is not None:
            yield GaugeMetricFamily(
                "llm_council_verifications_active",
                "Verifications submitted and not yet finalized.",
                value=float(counts[0]),
            )
            yield GaugeMetricFamily(
                "llm_council_verifications_overdue",
                "Verifications past their deadline without a payload.",
                value=float(counts[1]),
            )
        yield up


def collector(settings: CouncilSettings, ws: WorkerSettings | None = None) -> QueueCollector:
    return QueueCollector(settings, ws or WorkerSettings())


def registry(settings: CouncilSettings, ws: WorkerSettings) -> Any:
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector(settings, ws))
    return reg


def render(settings: CouncilSettings, ws: WorkerSettings | None = None) -> bytes:
    from prometheus_client import generate_latest

    return bytes(generate_latest(registry(settings, ws or WorkerSettings())))


def serve(settings: CouncilSettings, ws: WorkerSettings, *, address: str, port: int) -> None:
    """Serve /metrics until interrupted."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app

    class _Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

    app = make_wsgi_app(registry(settings, ws))
    with (
        make_server(address, port, app, handler_class=_Quiet) as httpd,
        contextlib.suppress(KeyboardInterrupt),
    ):
        httpd.serve_forever()
