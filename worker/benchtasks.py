"""Trivial tasks for `ops/bench/bench_workflow.py`: a bare chain of the council's shape
(same broker, queues and worker settings, no provider calls, no store) to measure what
Celery itself costs; and a probe of how a retried message is routed."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from worker.tasks import CouncilTask


@shared_task(name="council.bench.noop")
def noop(*args: Any) -> str:
    return "ok"


@shared_task(name="council.bench.route", bind=True, base=CouncilTask)
def route(self: Any, countdown: float = 0.0) -> dict[str, Any]:
    """Retry once after `countdown` seconds, then report where the retry was delivered."""
    if countdown and self.request.retries == 0:
        raise self.retry(countdown=countdown, max_retries=1)
    info = self.request.delivery_info or {}
    return {"routing_key": info.get("routing_key"), "retries": self.request.retries}
