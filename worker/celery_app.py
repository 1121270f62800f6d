"""The Celery app, one per tier group.

Workers: `celery -A worker.celery_app worker` serves the tiers in `LLM_COUNCIL_WORKER_TIERS`
(default `quick,balanced`; all of one group), consuming exactly their queues unless `-Q`
says otherwise. `llm-council worker --tiers ...` sets that variable and starts the same
command. The runner uses `get_app(group, settings, ws)` to publish to any group.

The broker is whatever `LLM_COUNCIL_BROKER_URL` names (Redis or RabbitMQ, see
`worker.config`). On RabbitMQ a worker refuses to start, with one line on stderr and exit
status 2, when a task of its tiers could outlive the broker's `consumer_timeout`.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from celery import Celery
from celery.backends.redis import RedisBackend
from celery.signals import celeryd_init

from shared.settings import CouncilSettings, load_settings
from worker.config import (
    GROUPS,
    WorkerSettings,
    celery_config,
    consumer_timeout_problem,
    group_for_tiers,
    parse_tiers,
)

TASK_MODULES = ["worker.tasks", "worker.benchtasks"]
DEFAULT_WORKER_TIERS = "quick,balanced"
WORKER_TIERS_ENV = "LLM_COUNCIL_WORKER_TIERS"


class PublishOnlyRedisBackend(RedisBackend):
    """The runner's result backend: it records chord metadata when a canvas is published,
    exactly like RedisBackend, but never subscribes to task results. The runner waits on
    its own state keys; without this, every published chord would leave one pub/sub
    subscription per header task open in a long-running process."""

    def __init__(self, app: Any = None, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app=app, url=url or app.conf.result_backend, **kwargs)

    def add_pending_result(
        self, result: Any, weak: bool = False, start_drainer: bool = True
    ) -> Any:
        return result

    def add_pending_results(self, results: Any, weak: bool = False) -> Any:
        return list(results)

    def on_task_call(self, producer: Any, task_id: str) -> None:
        return None


def make_app(
    group: str, settings: CouncilSettings, ws: WorkerSettings, *, publisher: bool = False
) -> Celery:
    """The app of one tier group; `publisher=True` for processes that only publish."""
    if group not in GROUPS:
        raise ValueError(f"unknown tier group {group!r}; expected one of {', '.join(GROUPS)}")
    app = Celery(f"llm-council-{group}", set_as_current=False)
    if publisher:
        app.backend_cls = PublishOnlyRedisBackend
    app.conf.update(celery_config(group, settings, ws))
    app.conf.update(include=TASK_MODULES)
    app.conf.llm_council_group = group
    return app


_apps: dict[tuple[str, str, str], Celery] = {}
_apps_lock = threading.Lock()


def get_app(group: str, settings: CouncilSettings, ws: WorkerSettings) -> Celery:
    """A cached app per (group, settings) for publishing from the runner."""
    key = (group, settings.model_dump_json(), ws.model_dump_json())
    with _apps_lock:
        app = _apps.get(key)
        if app is None:
            app = make_app(group, settings, ws, publisher=True)
            _apps[key] = app
        return app


def worker_group() -> str:
    return group_for_tiers(parse_tiers(os.environ.get(WORKER_TIERS_ENV, DEFAULT_WORKER_TIERS)))


def _worker_app() -> Celery:
    app = make_app(worker_group(), load_settings(), WorkerSettings())
    app.set_current()
    app.set_default()
    return app


_worker: Celery | None = None

#: Exit status of a worker that refuses to start (the CLI's setup-error status).
EXIT_REFUSED = 2


@celeryd_init.connect
def refuse_unsafe_limits(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Stop a worker before it consumes anything if its tasks could outlive the broker's
    consumer timeout (RabbitMQ): they would be redelivered while they run."""
    app = getattr(instance, "app", None)
    group = getattr(getattr(app, "conf", None), "llm_council_group", None)
    if group not in GROUPS:
        return  # not one of our apps
    problem = consumer_timeout_problem(group, load_settings(), WorkerSettings())
    if problem is not None:
        sys.stderr.write(f"llm-council worker: {problem}\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_REFUSED)


def __getattr__(name: str) -> Any:
    """`app` (and `celery`) are built on first access, from the environment."""
    global _worker
    if name in ("app", "celery"):
        if _worker is None:
            _worker = _worker_app()
        return _worker
    raise AttributeError(name)
