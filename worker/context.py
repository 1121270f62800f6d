"""What the runner, the tasks and the watchdog share in one process: settings, the Redis
client, key names, the stage store, the state store, and (in workers) the provider client.

Built lazily and rebuilt after a fork, so a prefork child never reuses its parent's
sockets or heartbeat thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from shared.pipeline import RunPlan
from shared.settings import CouncilSettings, load_settings
from worker.config import WorkerSettings
from worker.keys import FINAL_TTL_S, RECORD_TTL_S, Keys
from worker.state import StateStore
from worker.store import StageStore

PLAN_CACHE_SIZE = 256


def redis_client(url: str, *, connect_timeout: float = 5.0) -> Any:
    import redis

    return redis.Redis.from_url(
        url,
        socket_connect_timeout=connect_timeout,
        socket_timeout=30.0,
        health_check_interval=25,
    )


@dataclass
class Context:
    settings: CouncilSettings
    ws: WorkerSettings
    client: Any
    keys: Keys
    store: StageStore
    state: StateStore
    _plans: OrderedDict[str, RunPlan] = field(default_factory=OrderedDict)
    _plans_lock: threading.Lock = field(default_factory=threading.Lock)
    _provider: Any = None

    @classmethod
    def build(cls, settings: CouncilSettings, ws: WorkerSettings) -> Context:
        client = redis_client(settings.redis_url)
        keys = Keys(ws.key_prefix)
        return cls(
            settings=settings,
            ws=ws,
            client=client,
            keys=keys,
            store=StageStore(client, lease_ttl_s=ws.lease_ttl_s, heartbeat_s=ws.lease_heartbeat_s),
            state=StateStore(client, keys),
        )

    # --- plans ---------------------------------------------------------------------------
    def plan(self, vid: str) -> RunPlan | None:
        """The verification's plan (immutable, so cached per process)."""
        with self._plans_lock:
            plan = self._plans.get(vid)
            if plan is not None:
                self._plans.move_to_end(vid)
                return plan
        raw = self.client.get(self.keys.plan(vid))
        if raw is None:
            return None
        plan = RunPlan.model_validate_json(raw)
        with self._plans_lock:
            self._plans[vid] = plan
            while len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
        return plan

    @staticmethod
    def record_ttl(plan_or_deadline: RunPlan | float) -> int:
        deadline = (
            plan_or_deadline.deadline_at
            if isinstance(plan_or_deadline, RunPlan)
            else plan_or_deadline
        )
        return max(60, int(deadline - time.time() + RECORD_TTL_S))

    final_ttl = FINAL_TTL_S

    # --- provider ------------------------------------------------------------------------
    @property
    def provider(self) -> Any:
        if self._provider is None:
            from shared.providers.client import HttpProviderClient

            self._provider = HttpProviderClient.from_settings(self.settings)
        return self._provider


_lock = threading.Lock()
_ctx: Context | None = None
_ctx_pid = 0


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # it may have been held by another thread at fork time


os.register_at_fork(after_in_child=_after_fork_in_child)


def worker_context() -> Context:
    """The context of a worker process, from its environment (read once per process)."""
    global _ctx, _ctx_pid
    with _lock:
        if _ctx is None or _ctx_pid != os.getpid():
            _ctx = Context.build(load_settings(), WorkerSettings())
            _ctx_pid = os.getpid()
        return _ctx


def reset_worker_context() -> None:
    global _ctx
    with _lock:
        _ctx = None
