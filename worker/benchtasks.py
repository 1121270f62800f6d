"""Trivial tasks for `ops/bench/bench_workflow.py`: a bare chain of the council's shape
(same broker, queues and worker settings, no provider calls, no store) to measure what
Celery itself costs."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="council.bench.noop")
def noop(*args: Any) -> str:
    return "ok"
