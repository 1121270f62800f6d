"""Real Celery workers for integration tests, started and stopped by PID.

A `CeleryStack` is a private namespace on the test Redis: its own key prefix for the stage
store, state and result backend, and its own broker namespace (kombu `global_keyprefix`),
so tests never see another run's messages and never flush anything. Its settings are
short on purpose (visibility timeout 4 s, a restore scan every 0.5 s, leases of 2 s), so a
killed worker's tasks come back in seconds; production values are in docs/workflow.md.

With `broker_url` set to an `amqp://` URL the stack uses RabbitMQ as its broker (Redis stays
its store and result backend) and keeps the production broker settings: RabbitMQ has no
visibility timeout to shorten. Each such stack gets its own RabbitMQ virtual host, created
and deleted around the test (`rabbitmqctl add_vhost` / `delete_vhost`), so its queues,
exchanges and messages are never seen by, and never touch, any other vhost.

`rabbitmq` (session fixture) finds a RabbitMQ node the tests may administer: the one on
127.0.0.1:5672 when it answers and `rabbitmqctl` can manage it, else a private node started
from `rabbitmq-server` on free ports in a temporary directory (stopped at the end), else
the AMQP tests are skipped with the reason. `RabbitNode.start_private(...)` starts such a
node with a chosen `consumer_timeout` for tests of that limit.

`WorkerProcess` runs `python -m celery -A worker.celery_app worker ...` in its own process
group and can SIGKILL the whole worker (main process and pool children), SIGKILL one pool
child, SIGTERM the main process (warm shutdown) and start it again.

Test modules import the fixtures they use:
`from tests.integration.worker_fixtures import celery_stack, shared_stack  # noqa: F401`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.helpers import free_port, reachable

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


# --- RabbitMQ ------------------------------------------------------------------------------

RABBIT_HOST = "127.0.0.1"
RABBIT_PORT = 5672
RABBIT_USER = "guest"
RABBIT_PASSWORD = "guest"
#: Debian and Ubuntu put the real scripts here; /usr/sbin/rabbitmq-* are `su rabbitmq`
#: wrappers that would not pass a private node's environment through.
RABBIT_LIB_BIN = Path("/usr/lib/rabbitmq/bin")


def rabbit_program(name: str, *, private: bool) -> str | None:
    if private and (RABBIT_LIB_BIN / name).exists():
        return str(RABBIT_LIB_BIN / name)
    return shutil.which(name)


@dataclass
class RabbitNode:
    """A RabbitMQ node the tests may administer with `rabbitmqctl`."""

    port: int
    ctl: str
    nodename: str | None = None
    env: dict[str, str] | None = None
    host: str = RABBIT_HOST
    proc: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None

    def rabbitmqctl(self, *args: str, timeout: float = 60.0) -> str:
        argv = [self.ctl, "-q"]
        if self.nodename:
            argv += ["-n", self.nodename]
        # Not the tests' private XDG_CONFIG_HOME: the CLI, run as the rabbitmq user by the
        # Debian wrapper, could not read it and would print an Erlang error report.
        env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
        out = subprocess.run(
            [*argv, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, **(self.env or {})},
        )
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def url(self, vhost: str = "/") -> str:
        return (
            f"amqp://{RABBIT_USER}:{RABBIT_PASSWORD}@{self.host}:{self.port}/"
            f"{quote(vhost, safe='')}"
        )

    def add_vhost(self, name: str) -> str:
        """Create `name` with full rights for the test user; return its broker URL."""
        self.rabbitmqctl("add_vhost", name)
        self.rabbitmqctl("set_permissions", "-p", name, RABBIT_USER, ".*", ".*", ".*")
        return self.url(name)

    def delete_vhost(self, name: str) -> None:
        """Delete `name` and everything in it (its queues, exchanges, messages) only."""
        assert name.startswith("llmc-test-"), f"refusing to delete vhost {name!r}"
        with contextlib.suppress(RuntimeError):
            self.rabbitmqctl("delete_vhost", name)

    def get_env(self, key: str) -> str:
        return self.rabbitmqctl("eval", f"application:get_env(rabbit, {key}).").strip()

    @classmethod
    def shared(cls) -> RabbitNode | None:
        """The node on 127.0.0.1:5672, if it answers and `rabbitmqctl` manages it."""
        ctl = shutil.which("rabbitmqctl")
        if ctl is None or not reachable(RABBIT_HOST, RABBIT_PORT):
            return None
        node = cls(port=RABBIT_PORT, ctl=ctl)
        try:
            node.rabbitmqctl("list_vhosts", timeout=20)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            return None
        return node

    @classmethod
    def start_private(
        cls,
        *,
        consumer_timeout_ms: int | None = None,
        tick_ms: int | None = None,
        timeout: float = 60.0,
    ) -> RabbitNode:
        """A node of our own on free ports, configured in a temporary directory (no plugins,
        no management UI). `tick_ms` shortens how often channels check `consumer_timeout`
        (RabbitMQ 3.10: every `channel_tick_interval`, 60 s by default)."""
        server = rabbit_program("rabbitmq-server", private=True)
        ctl = rabbit_program("rabbitmqctl", private=True)
        if server is None or ctl is None:
            raise RuntimeError("rabbitmq-server is not installed")
        work = Path(tempfile.mkdtemp(prefix="llmc-rabbit-"))
        port, dist = free_port(), free_port()
        name = f"llmc-test-{uuid.uuid4().hex[:8]}@localhost"
        conf = [f"listeners.tcp.local = 127.0.0.1:{port}", "loopback_users.guest = false"]
        if consumer_timeout_ms is not None:
            conf.append(f"consumer_timeout = {consumer_timeout_ms}")
        (work / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        advanced = f"[{{rabbit, [{{channel_tick_interval, {tick_ms}}}]}}]." if tick_ms else "[]."
        (work / "advanced.config").write_text(advanced + "\n")
        (work / "enabled_plugins").write_text("[].\n")
        (work / "rabbitmq-env.conf").write_text("")
        env = {
            "HOME": str(work),  # its own Erlang cookie, shared with our rabbitmqctl
            "RABBITMQ_NODENAME": name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_MNESIA_BASE": str(work / "mnesia"),
            "RABBITMQ_LOG_BASE": str(work / "log"),
            "RABBITMQ_CONFIG_FILE": str(work / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(work / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(work / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(work / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(work / "rabbit.pid"),
        }
        with (work / "server.log").open("wb") as out:
            proc = subprocess.Popen(
                [server],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=work,
            )
        node = cls(port=port, ctl=ctl, nodename=name, env=env, proc=proc, workdir=work)

        def up() -> bool:
            if proc.poll() is not None:
                log = (work / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"rabbitmq-server exited at start-up:\n{log}")
            return reachable(RABBIT_HOST, port)

        try:
            wait_until(up, timeout, "a private RabbitMQ node", step=0.1)
        except BaseException:
            node.stop()
            raise
        return node

    def stop(self) -> None:
        """Stop a private node (by its process group) and remove its directory."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitNode]:
    """A RabbitMQ node for AMQP tests: the shared one on 127.0.0.1:5672, else our own."""
    node = RabbitNode.shared()
    if node is not None:
        yield node
        return
    if rabbit_program("rabbitmq-server", private=True) is None:
        pytest.skip("RabbitMQ is not available: nothing answers on 127.0.0.1:5672 and "
                    "rabbitmq-server is not installed")  # fmt: skip
    node = RabbitNode.start_private()
    try:
        yield node
    finally:
        node.stop()


def vhost_name(name: str) -> str:
    return f"llmc-test-{name}"


@contextlib.contextmanager
def rabbit_vhost(node: RabbitNode, name: str) -> Iterator[str]:
    """A fresh vhost `llmc-test-<name>` on `node`, deleted afterwards; yields its URL."""
    vhost = vhost_name(name)
    url = node.add_vhost(vhost)
    try:
        yield url
    finally:
        node.delete_vhost(vhost)


# --- Celery ---------------------------------------------------------------------------------


@dataclass
class CeleryStack:
    redis_url: str
    workdir: Path
    name: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    visibility_timeout: float = TEST_VISIBILITY_TIMEOUT_S
    workers: list[WorkerProcess] = field(default_factory=list)
    #: The broker; None means the Redis at `redis_url` (store and broker in one).
    broker_url: str | None = None
    #: RabbitMQ only: the node and the stack's own vhost on it.
    rabbit: RabbitNode | None = None
    vhost: str | None = None

    def rabbitmqctl(self, *args: str) -> str:
        """`rabbitmqctl <args> -p <this stack's vhost>` (RabbitMQ stacks only)."""
        assert self.rabbit is not None and self.vhost is not None, "not a RabbitMQ stack"
        return self.rabbit.rabbitmqctl(*args, "-p", self.vhost)

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def is_amqp(self) -> bool:
        return self.broker.split(":", 1)[0] in ("amqp", "amqps", "pyamqp")

    @property
    def broker_kind(self) -> str:
        return "amqp" if self.is_amqp else "redis"

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
                "LLM_COUNCIL_BROKER_URL": self.broker,
                "LLM_COUNCIL_REDIS_URL": self.redis_url,
                "LLM_COUNCIL_KEY_PREFIX": self.key_prefix,
                "LLM_COUNCIL_BROKER_KEY_PREFIX": self.broker_prefix,
                "LLM_COUNCIL_LEASE_TTL_S": str(TEST_LEASE_TTL_S),
                "LLM_COUNCIL_LEASE_HEARTBEAT_S": str(TEST_HEARTBEAT_S),
                "LLM_COUNCIL_WAIT_GRACE_S": str(TEST_WAIT_GRACE_S),
                "XDG_CONFIG_HOME": str(self.workdir / "xdg"),
                "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if not self.is_amqp:  # RabbitMQ has no visibility timeout: production settings
            base.update(
                {
                    "LLM_COUNCIL_VISIBILITY_TIMEOUT_FAST": str(self.visibility_timeout),
                    "LLM_COUNCIL_VISIBILITY_TIMEOUT_SLOW": str(self.visibility_timeout),
                    "LLM_COUNCIL_UNACKED_RESTORE_INTERVAL": str(TEST_RESTORE_INTERVAL_S),
                }
            )
        base.update(extra)
        return base

    def worker_settings(self) -> Any:
        from worker.config import WorkerSettings

        redis_only: dict[str, Any] = (
            {}
            if self.is_amqp
            else {
                "visibility_timeout_fast": self.visibility_timeout,
                "visibility_timeout_slow": self.visibility_timeout,
                "unacked_restore_interval": TEST_RESTORE_INTERVAL_S,
            }
        )
        return WorkerSettings(
            key_prefix=self.key_prefix,
            broker_key_prefix=self.broker_prefix,
            **redis_only,
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
            broker_url=self.broker,
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


BROKERS = ("redis", "amqp")


@contextlib.contextmanager
def stack_on(
    broker: str, redis_url: str, workdir: Path, request: pytest.FixtureRequest
) -> Iterator[CeleryStack]:
    """A private stack on `broker` ("redis" or "amqp"); the AMQP one in its own vhost."""
    if broker == "redis":
        stack = CeleryStack(redis_url=redis_url, workdir=workdir)
        try:
            yield stack
        finally:
            stack.close()
        return
    node: RabbitNode = request.getfixturevalue("rabbitmq")
    with amqp_stack_on(node, redis_url, workdir) as stack:
        yield stack


@contextlib.contextmanager
def amqp_stack_on(node: RabbitNode, redis_url: str, workdir: Path) -> Iterator[CeleryStack]:
    """A private stack whose broker is its own new vhost on `node` (deleted afterwards)."""
    name = uuid.uuid4().hex[:10]
    with rabbit_vhost(node, name) as url:
        stack = CeleryStack(
            redis_url=redis_url,
            workdir=workdir,
            name=name,
            broker_url=url,
            rabbit=node,
            vhost=vhost_name(name),
        )
        try:
            yield stack
        finally:
            stack.close()


@pytest.fixture(params=BROKERS)
def broker_stack(
    request: pytest.FixtureRequest, redis_url: str, tmp_path: Path
) -> Iterator[CeleryStack]:
    """`celery_stack`, once per broker: Redis (short visibility timeout) and RabbitMQ
    (its own vhost, production settings)."""
    with stack_on(request.param, redis_url, tmp_path, request) as stack:
        yield stack


@pytest.fixture
def amqp_stack(
    request: pytest.FixtureRequest, redis_url: str, tmp_path: Path
) -> Iterator[CeleryStack]:
    """A private stack with RabbitMQ as its broker, in its own vhost."""
    with stack_on("amqp", redis_url, tmp_path, request) as stack:
        yield stack


@pytest.fixture(scope="module")
def shared_amqp_stack(
    request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryStack]:
    """`shared_stack` with RabbitMQ as the broker: one vhost and one worker for a module."""
    with stack_on("amqp", redis_url, tmp_path_factory.mktemp("amqp"), request) as stack:
        stack.worker(concurrency=4, name="shared-amqp").start()
        yield stack


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
