"""Real Celery workers for integration tests, started and stopped by PID.

A `CeleryStack` is a private namespace on the test Redis: its own key prefix for the stage
store, state and result backend, and its own broker namespace (kombu `global_keyprefix`),
so tests never see another run's messages and never flush anything. Its settings are
short on purpose (visibility timeout 4 s, a restore scan every 0.5 s, leases of 2 s), so a
killed worker's tasks come back in seconds; production values are in docs/workflow.md.

`WorkerProcess` runs `python -m celery -A worker.celery_app worker ...` in its own process
group and can SIGKILL the whole worker (main process and pool children), SIGKILL one pool
child, SIGTERM the main process (warm shutdown) and start it again.

Test modules import the fixtures they use:
`from tests.integration.worker_fixtures import celery_stack, shared_stack  # noqa: F401`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")
CHAIRMAN = "careful-chair"

#: Test values (production values are derived from the tier deadlines, see worker.config).
TEST_VISIBILITY_TIMEOUT_S = 4.0
TEST_RESTORE_INTERVAL_S = 0.5
TEST_LEASE_TTL_S = 2.0
TEST_HEARTBEAT_S = 0.5
TEST_WAIT_GRACE_S = 1.0


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)


@dataclass
class CeleryStack:
    redis_url: str
    workdir: Path
    name: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    visibility_timeout: float = TEST_VISIBILITY_TIMEOUT_S
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def key_prefix(self) -> str:
        return f"llmc-test-{self.name}:"

    @property
    def broker_prefix(self) -> str:
        return f"llmc-test-{self.name}:b:"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a worker or CLI subprocess pointing at this stack."""
        base = {
            k: v
            for k, v in os.environ.items()
            if (not k.startswith("LLM_COUNCIL_") or k.startswith("LLM_COUNCIL_TEST_"))
            and k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")
        }
        base.update(
            {
                "LLM_COUNCIL_BROKER_URL": self.redis_url,
                "LLM_COUNCIL_REDIS_URL": self.redis_url,
                "LLM_COUNCIL_KEY_PREFIX": self.key_prefix,
                "LLM_COUNCIL_BROKER_KEY_PREFIX": self.broker_prefix,
                "LLM_COUNCIL_VISIBILITY_TIMEOUT_FAST": str(self.visibility_timeout),
                "LLM_COUNCIL_VISIBILITY_TIMEOUT_SLOW": str(self.visibility_timeout),
                "LLM_COUNCIL_UNACKED_RESTORE_INTERVAL": str(TEST_RESTORE_INTERVAL_S),
                "LLM_COUNCIL_LEASE_TTL_S": str(TEST_LEASE_TTL_S),
                "LLM_COUNCIL_LEASE_HEARTBEAT_S": str(TEST_HEARTBEAT_S),
                "LLM_COUNCIL_WAIT_GRACE_S": str(TEST_WAIT_GRACE_S),
                "XDG_CONFIG_HOME": str(self.workdir / "xdg"),
                "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1",
            }
        )
        base.update(extra)
        return base

    def worker_settings(self) -> Any:
        from worker.config import WorkerSettings

        return WorkerSettings(
            key_prefix=self.key_prefix,
            broker_key_prefix=self.broker_prefix,
            visibility_timeout_fast=self.visibility_timeout,
            visibility_timeout_slow=self.visibility_timeout,
            unacked_restore_interval=TEST_RESTORE_INTERVAL_S,
            lease_ttl_s=TEST_LEASE_TTL_S,
            lease_heartbeat_s=TEST_HEARTBEAT_S,
            wait_grace_s=TEST_WAIT_GRACE_S,
        )

    def settings(
        self,
        fake: Any,
        members: tuple[str, ...] = MEMBERS,
        chairman: str = CHAIRMAN,
        **overrides: Any,
    ) -> Any:
        from shared.settings import CouncilSettings

        return CouncilSettings(
            models=[fake.model_id(m) for m in members],
            chairman=fake.model_id(chairman),
            broker_url=self.redis_url,
            redis_url=self.redis_url,
            **overrides,
        )

    def context(self, settings: Any) -> Any:
        from worker.runner import runner_context

        return runner_context(settings, self.worker_settings())

    def redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url)

    def worker(
        self,
        tiers: str = "quick,balanced",
        concurrency: int = 4,
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        proc = WorkerProcess(self, tiers=tiers, concurrency=concurrency, name=name, env=env)
        self.workers.append(proc)
        return proc

    def own_keys(self) -> list[bytes]:
        client = self.redis()
        try:
            return [
                k
                for prefix in (self.key_prefix, self.broker_prefix)
                for k in client.scan_iter(match=f"{prefix}*", count=1000)
            ]
        finally:
            client.close()

    def delete_keys(self, keep: Callable[[str], bool] = lambda key: False) -> int:
        """Delete this stack's keys (never anything else), except those `keep` names."""
        client = self.redis()
        try:
            doomed = [k for k in set(self.own_keys()) if not keep(k.decode())]
            if doomed:
                client.delete(*doomed)
            return len(doomed)
        finally:
            client.close()

    def close(self) -> None:
        for proc in self.workers:
            proc.stop()
        self.delete_keys()


class WorkerProcess:
    """One `celery worker` (main process + prefork pool) in its own process group."""

    def __init__(
        self,
        stack: CeleryStack,
        *,
        tiers: str,
        concurrency: int,
        name: str | None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.stack = stack
        self.extra_env = dict(env or {})
        self.tiers = tiers
        self.concurrency = concurrency
        self.name = name or f"t{uuid.uuid4().hex[:6]}"
        self.log = stack.workdir / f"worker-{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        from worker.config import parse_tiers, queue_name

        queues = ",".join(queue_name(t) for t in parse_tiers(self.tiers))
        return [
            sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
            "-Q", queues, "-c", str(self.concurrency), "-P", "prefork", "-O", "fair", "-E",
            "-n", f"{self.name}@%h", "--loglevel", "INFO", "--without-gossip",
            "--without-mingle",
        ]  # fmt: skip

    def start(self, timeout: float = 60.0) -> WorkerProcess:
        self.starts += 1
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=ROOT,
                env=self.stack.env(LLM_COUNCIL_WORKER_TIERS=self.tiers, **self.extra_env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"worker exited at start-up:\n{self.tail()}")
            with self.log.open("rb") as fh:
                fh.seek(offset)
                return b" ready." in fh.read()

        wait_until(ready, timeout, f"worker {self.name} to be ready", step=0.1)
        return self

    def tail(self, lines: int = 60) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """PIDs of the pool processes (children of the main process)."""
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 2 and fields[1] == str(self.pid) and fields[0] != "Z":
                out.append(int(entry.name))
        return sorted(out)

    def kill_all(self) -> None:
        """SIGKILL the whole worker: its main process and every pool child at once."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def kill_child(self, pid: int) -> None:
        assert pid in self.children(), f"{pid} is not a pool child of {self.pid}"
        os.kill(pid, signal.SIGKILL)

    def warm_shutdown(self, timeout: float = 60.0) -> int:
        """SIGTERM to the main process only: finish running tasks, hand back the rest."""
        assert self.proc is not None
        os.kill(self.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def restart(self) -> WorkerProcess:
        return self.start()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        # Pool children left behind by a killed main process.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


@pytest.fixture
def celery_stack(redis_url: str, tmp_path: Path) -> Iterator[CeleryStack]:
    """A private stack for one test (start its workers with `stack.worker().start()`)."""
    stack = CeleryStack(redis_url=redis_url, workdir=tmp_path)
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def shared_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CeleryStack]:
    """One stack and one running worker shared by a module's tests that kill nothing."""
    stack = CeleryStack(redis_url=redis_url, workdir=tmp_path_factory.mktemp("celery"))
    try:
        stack.worker(concurrency=4, name="shared").start()
        yield stack
    finally:
        stack.close()


# --- helpers for verifications ----------------------------------------------------------


def commit_change(repo: Any, content: str, path: str = "app/db.py") -> str:
    """A commit that changes `path` to `content` (on top of a base commit)."""
    if not (repo.root / "README.md").exists():
        repo.commit("base", {"README.md": "demo\n"})
    if (repo.root / path).exists() and (repo.root / path).read_text() == content:
        repo.commit("touch", {path: content + "\n"})
    return str(repo.commit("change", {path: content}))


def plan_for(
    repo: Any, settings: Any, sha: str, *, tier: str = "quick", seed: int | None = 11
) -> Any:
    from shared.pipeline import plan_run
    from shared.request import VerifyRequest
    from shared.selection import resolve_subject

    request = VerifyRequest(snapshot_id=sha, tier=tier, repo=str(repo.root), shuffle_seed=seed)
    subject = resolve_subject(repo.root, sha, None, settings=settings)
    return plan_run(request, settings, subject)


def make_plan(
    repo: Any, settings: Any, *, content: str, tier: str = "quick", seed: int | None = 11
) -> Any:
    """A commit changing `app/db.py` to `content`, planned for verification."""
    return plan_for(repo, settings, commit_change(repo, content), tier=tier, seed=seed)


class Background:
    """Run `run_remote` in a thread, so a test can act on the worker meanwhile."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished_at = time.time()

    def join(self, timeout: float) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"run_remote did not return within {timeout:.0f}s")
        if self.error is not None:
            raise self.error
        return self.result


def calls_by_key(fake: Any, vid: str) -> dict[tuple[str, str], dict[str, int]]:
    """(stage, model) -> {"calls", "completed"} for one verification."""
    return {
        (c["stage"], c["model"]): {"calls": c["calls"], "completed": c["completed"]}
        for c in fake.calls(verification=vid)
    }


def stored_results(stack: CeleryStack, vid: str) -> set[tuple[str, str]]:
    """(stage, model name) of every stage result stored for `vid`."""
    client = stack.redis()
    try:
        out = set()
        prefix = f"{stack.key_prefix}v:{vid}:r:"
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            stage, model = key.decode()[len(prefix) :].split(":", 1)
            out.add((stage, model.rsplit(":", 1)[-1]))
        return out
    finally:
        client.close()
