"""Benchmark: recovery from a killed worker, and zero-latency overhead, per broker.

    .venv/bin/python ops/bench/bench_recovery.py [--runs 30] [--redis-visibility 30]
                                                 [--redis-production]

In one run, against the fake provider (its own process, on loopback), with one prefork
worker (`-c 8`, the project's Celery settings) per broker, Redis (127.0.0.1:6379, or
LLM_COUNCIL_TEST_REDIS_URL) as the store and result backend throughout:

- brokers: Redis (a private key prefix, removed afterwards; nothing is flushed) and RabbitMQ
  (a private vhost `llmc-bench-<id>` on 127.0.0.1:5672 created and deleted with
  `rabbitmqctl`, or the vhost given with `--amqp-url`, which must hold nothing else);
- zero latency: median wall per verification for the Celery runner on each broker, the
  embedded runner, and a bare Celery chain of the same shape on each broker;
- recovery: a verification whose four stage-1 calls take 5 s each; 2 s into stage 1 the
  whole worker is SIGKILLed (main process and pool) and restarted 1 s later. Printed: when
  the killed messages were back in the queue (RabbitMQ: the broker requeues them when the
  connection drops), when the interrupted calls started again, and kill-to-payload.
  Redis gives the messages back only after its visibility timeout: the production value
  (215 s for quick/balanced, 1235 s for high/reasoning) is longer than any deadline of its
  tiers, so a whole-worker kill there ends unclear at the deadline; the measured Redis
  figure uses a stated shorter timeout (`--redis-visibility`, default 30 s), and
  `--redis-production` also measures the production case (three minutes: the balanced
  tier's deadline). The kill runs on the balanced tier: its stage 1 lasts up to 60 s.

Prints a markdown table (the README's performance section quotes it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ops.bench.bench_workflow import (  # noqa: E402
    CHAIRMAN,
    MEMBERS,
    SQL,
    _cleanup,
    fake_provider,
)

STAGE1_MS = 5000
KILL_AFTER_S = 2.0
RESTART_AFTER_S = 1.0
QUEUE = "council.quick"
#: The kill runs on the balanced tier: its stage 1 lasts up to 60 s, so messages Redis
#: restores after a 30 s visibility timeout still find stage 1 open.
KILL_TIER = "balanced"
KILL_QUEUE = "council.balanced"


def admin(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def calls_of(url: str, vid: str, stage: str) -> dict[str, int]:
    """model -> calls started, for one verification's stage."""
    rows = admin(url, "/admin/calls")["calls"]
    return {
        r["model"]: r["calls"] for r in rows if r["verification"] == vid and r["stage"] == stage
    }


def _wait(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.02) -> Any:
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise SystemExit(f"bench: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


@dataclass
class Worker:
    """One `celery worker` in its own process group, killed and restarted by PID."""

    env: dict[str, str]
    log: Path
    concurrency: int
    proc: subprocess.Popen[bytes] | None = None
    offset: int = 0

    def start(self) -> Worker:
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
                 "-Q", "council.quick,council.balanced", "-c", str(self.concurrency),
                 "-P", "prefork", "-O", "fair", "-E", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h",
                 "--loglevel", "INFO", "--without-gossip", "--without-mingle"],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise SystemExit(f"bench: worker exited at start-up, see {self.log}")
            with self.log.open("rb") as fh:
                fh.seek(self.offset)
                return b" ready." in fh.read()

        _wait(ready, 60, "the worker", step=0.05)
        return self

    def kill_all(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@dataclass
class Broker:
    label: str
    url: str
    kind: str  # "redis" or "amqp"
    env: dict[str, str] = field(default_factory=dict)
    ws_overrides: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def bench_vhost(amqp_url: str | None) -> Iterator[str | None]:
    """The RabbitMQ URL to use: `--amqp-url`, else a new vhost on 127.0.0.1:5672."""
    if amqp_url:
        yield amqp_url
        return
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        print("bench: rabbitmqctl not found and no --amqp-url: skipping RabbitMQ")
        yield None
        return
    vhost = f"llmc-bench-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
    run = subprocess.run
    for args in (["add_vhost", vhost], ["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]):
        out = run([ctl, "-q", *args], capture_output=True, text=True, env=env, timeout=60)
        if out.returncode != 0:
            print(f"bench: rabbitmqctl {args[0]} failed ({out.stderr.strip()}): skipping RabbitMQ")
            yield None
            return
    try:
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    finally:
        run([ctl, "-q", "delete_vhost", vhost], capture_output=True, env=env, timeout=60)


def rabbit_version() -> str:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return ""
    env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
    out = subprocess.run(
        [ctl, "-q", "version"], capture_output=True, text=True, env=env, timeout=30
    )
    return out.stdout.strip() if out.returncode == 0 else ""


def queued(url: str, queue: str) -> int:
    from kombu import Connection

    with Connection(url, connect_timeout=3) as conn:
        return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--runs", type=int, default=30, help="zero-latency runs per runner")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--redis-visibility", type=float, default=30.0, help="Redis timeout for the kill (s)"
    )
    parser.add_argument(
        "--redis-production",
        action="store_true",
        help="also kill a worker on Redis with the production visibility timeout (~1 min)",
    )
    parser.add_argument("--amqp-url", default=None, help="a RabbitMQ vhost for the benchmark")
    args = parser.parse_args(argv)
    # The production Redis run ends with the watchdog closing the verification: expected.
    logging.getLogger("worker.watchdog").setLevel(logging.ERROR)

    from celery import chain, group

    from shared.embedded import run_embedded
    from shared.pipeline import plan_run
    from shared.providers.client import HttpProviderClient, ProviderKeys
    from shared.request import VerifyRequest
    from shared.selection import resolve_subject
    from shared.settings import CouncilSettings
    from shared.tiers import Tier, verify_deadline_s
    from tests.helpers import GitRepo
    from worker.celery_app import make_app
    from worker.config import WorkerSettings, recovery_bound_s
    from worker.runner import run_remote, runner_context, submit_remote, wait_for

    redis_url = os.environ.get("LLM_COUNCIL_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
    tmp = Path(tempfile.mkdtemp(prefix="llmc-bench-recovery-"))
    repo = GitRepo(tmp / "repo")
    repo.commit("base", {"README.md": "bench\n"})
    sha = repo.commit("sql", {"app/db.py": SQL})
    prefixes: list[str] = []
    workers: list[Worker] = []

    def stack(broker: Broker, vt: float | None = None) -> tuple[Any, Any, Worker]:
        name = uuid.uuid4().hex[:8]
        prefix, bprefix = f"llmc-bench-{name}:", f"llmc-bench-{name}:b:"
        prefixes.extend([prefix, bprefix])
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LLM_COUNCIL_")},
            "LLM_COUNCIL_BROKER_URL": broker.url,
            "LLM_COUNCIL_REDIS_URL": redis_url,
            "LLM_COUNCIL_KEY_PREFIX": prefix,
            "LLM_COUNCIL_BROKER_KEY_PREFIX": bprefix,
            "LLM_COUNCIL_WORKER_TIERS": "quick,balanced",
            "PYTHONPATH": str(ROOT),
        }
        extra: dict[str, Any] = {}
        if vt is not None:
            env["LLM_COUNCIL_VISIBILITY_TIMEOUT_FAST"] = str(vt)
            extra["visibility_timeout_fast"] = vt
        ws = WorkerSettings(key_prefix=prefix, broker_key_prefix=bprefix, **extra)
        worker = Worker(env, tmp / f"worker-{name}.log", args.concurrency).start()
        workers.append(worker)
        return env, ws, worker

    with fake_provider() as url, bench_vhost(args.amqp_url) as amqp_url:
        base = f"openai-compat@{url}/v1"

        def settings_for(broker_url: str) -> CouncilSettings:
            return CouncilSettings(
                models=[f"{base}:{m}" for m in MEMBERS],
                chairman=f"{base}:{CHAIRMAN}",
                broker_url=broker_url,
                redis_url=redis_url,
                transcript_dir=tmp / "logs",
            )

        brokers = [Broker("Redis", redis_url, "redis")]
        if amqp_url:
            version = rabbit_version()
            brokers.append(Broker(f"RabbitMQ {version}".strip(), amqp_url, "amqp"))
        subject = resolve_subject(repo.root, sha, None, settings=settings_for(redis_url))

        def plan(settings: CouncilSettings, tier: str = "quick") -> Any:
            request = VerifyRequest(snapshot_id=sha, tier=tier, repo=str(repo.root))
            return plan_run(request, settings, subject)

        # --- zero latency --------------------------------------------------------------
        admin(url, "/admin/reset", {})
        admin(url, "/admin/config", {"latency_ms": 0, "faults": {}})
        runners: dict[str, dict[str, Any]] = {}
        for broker in brokers:
            _, ws, _ = stack(broker, vt=args.redis_visibility if broker.kind == "redis" else None)
            settings = settings_for(broker.url)
            bare_app = make_app("fast", settings, ws)

            def bare(app: Any = bare_app, n: int = len(MEMBERS)) -> Any:
                sig = chain(
                    group(app.signature("council.bench.noop", queue=QUEUE, immutable=True)
                          for _ in range(n)),
                    group(app.signature("council.bench.noop", queue=QUEUE) for _ in range(n)),
                    app.signature("council.bench.noop", queue=QUEUE),
                )  # fmt: skip
                return sig.apply_async().get(timeout=60)

            runners[broker.label] = {"settings": settings, "ws": ws, "bare": bare, "cel": [],
                                     "bare_s": []}  # fmt: skip
            for _ in range(3):  # warm up
                bare()
                run_remote(plan(settings), settings, options=ws)
        emb_settings = settings_for(redis_url)
        client = HttpProviderClient(ProviderKeys.from_settings(emb_settings))
        for _ in range(3):
            run_embedded(plan(emb_settings), client)
        emb: list[float] = []
        for _ in range(args.runs):  # interleaved, so load from elsewhere hits all alike
            p = plan(emb_settings)
            t0 = time.perf_counter()
            run_embedded(p, client)
            emb.append(time.perf_counter() - t0)
            for r in runners.values():
                p = plan(r["settings"])
                t0 = time.perf_counter()
                run_remote(p, r["settings"], options=r["ws"])
                r["cel"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                r["bare"]()
                r["bare_s"].append(time.perf_counter() - t0)
        emb_ms = statistics.median(emb) * 1000
        for w in workers:
            w.stop()
        workers.clear()

        # --- recovery --------------------------------------------------------------------
        slow = {
            m: {"behaviour": f"slow-{STAGE1_MS}", "stages": ["stage1"], "times": 2} for m in MEMBERS
        }

        def kill_run(broker: Broker, vt: float | None) -> dict[str, Any]:
            _, ws, worker = stack(broker, vt=vt)
            settings = settings_for(broker.url)
            admin(url, "/admin/reset", {})
            admin(url, "/admin/config", {"latency_ms": 0, "faults": slow})
            p = plan(settings, KILL_TIER)
            vid = p.verification_id
            submit_remote(p, settings, options=ws)
            _wait(lambda: len(calls_of(url, vid, "stage1")) == len(MEMBERS), 30, "stage 1")
            time.sleep(KILL_AFTER_S)
            worker.kill_all()
            killed = time.time()
            requeued = None
            if broker.kind == "amqp":
                _wait(
                    lambda: queued(broker.url, KILL_QUEUE) >= len(MEMBERS),
                    10,
                    "the requeue",
                    step=0.002,
                )
                requeued = time.time() - killed
            time.sleep(max(0.0, killed + RESTART_AFTER_S - time.time()))
            worker.start()
            waiting: dict[str, Any] = {}

            def wait() -> None:
                waiting["payload"] = wait_for(runner_context(settings, ws), p)
                waiting["done"] = time.time()

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            rerun = None
            while thread.is_alive():
                if rerun is None and all(c >= 2 for c in calls_of(url, vid, "stage1").values()):
                    rerun = time.time() - killed
                thread.join(0.05)
            payload = waiting["payload"]
            worker.stop()
            workers.remove(worker)
            return {
                "requeued": requeued,
                "rerun": rerun,
                "total": waiting["done"] - killed,
                "verdict": payload.verdict.value,
                "reason": payload.unclear_reason.value if payload.unclear_reason else "",
            }

        kills: dict[str, dict[str, Any]] = {}
        for broker in brokers:
            vt = args.redis_visibility if broker.kind == "redis" else None
            kills[broker.label] = kill_run(broker, vt)
        production: dict[str, Any] | None = None
        if args.redis_production:
            production = kill_run(brokers[0], None)
        admin(url, "/admin/config", {"faults": {}})

        ws_default = WorkerSettings()
        bound = recovery_bound_s(Tier(KILL_TIER), settings_for(redis_url), ws_default)
        deadline = verify_deadline_s(Tier(KILL_TIER))

    # --- report --------------------------------------------------------------------------
    print(
        f"llm-council recovery and overhead by broker ({args.runs} zero-latency runs each, "
        f"4 models, prefork -c {args.concurrency}, this machine)\n"
    )
    print(
        f"Recovery: four {STAGE1_MS / 1000:.0f} s stage-1 calls; the whole worker SIGKILLed "
        f"{KILL_AFTER_S:.0f} s into stage 1 and restarted {RESTART_AFTER_S:.0f} s later "
        f"({KILL_TIER} tier, deadline {deadline:.0f} s).\n"
    )
    print("| broker | killed messages back in the queue | interrupted calls restart | "
          "kill to payload | outcome |")  # fmt: skip
    print("|---|---|---|---|---|")

    def outcome(k: dict[str, Any]) -> str:
        return k["verdict"] + (f" ({k['reason']})" if k["reason"] else "")

    for broker in brokers:
        k = kills[broker.label]
        if broker.kind == "amqp":
            label = f"{broker.label} (quorum queues, production settings)"
            back = f"{k['requeued'] * 1000:.0f} ms after the kill"
        else:
            label = f"Redis, visibility timeout {args.redis_visibility:.0f} s (shortened)"
            back = "after the visibility timeout, at the restarted worker's restore scan"
        rerun = "never" if k["rerun"] is None else f"{k['rerun']:.1f} s after the kill"
        print(f"| {label} | {back} | {rerun} | **{k['total']:.1f} s** | {outcome(k)} |")
    vt_prod = bound - ws_default.unacked_restore_interval
    if production is not None:
        total, result = f"**{production['total']:.1f} s**", outcome(production)
    else:
        total, result = "not measured (`--redis-production`)", "unclear (timeout), by design"
    print(
        f"| Redis, production visibility timeout {vt_prod:.0f} s | up to {bound:.0f} s after "
        f"delivery (timeout + restore scan): after the {deadline:.0f} s deadline | never "
        f"before the deadline | {total} | {result}: the watchdog closes it at the deadline |"
    )
    print("\nZero latency, median wall per verification:\n")
    print("| broker | Celery runner | bare Celery chain (4+4+1 trivial tasks) | Celery / bare | "
          "Celery - embedded |")  # fmt: skip
    print("|---|---|---|---|---|")
    for broker in brokers:
        r = runners[broker.label]
        c_ms = statistics.median(r["cel"]) * 1000
        b_ms = statistics.median(r["bare_s"]) * 1000
        print(f"| {broker.label} | {c_ms:.1f} ms | {b_ms:.1f} ms | {c_ms / b_ms:.2f} x | "
              f"{c_ms - emb_ms:.1f} ms |")  # fmt: skip
    print(f"| (embedded runner, no broker) | {emb_ms:.1f} ms | | | |")
    _cleanup(redis_url, tuple(prefixes))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
