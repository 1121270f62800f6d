"""Benchmark: the Celery runner against the embedded runner and a bare Celery chain.

    .venv/bin/python ops/bench/bench_workflow.py [--runs 30] [--burst 200] [--latency-ms 1000]

In one run, against the fake provider (its own process, on loopback) and one prefork worker
(`-c 8`, the project's Celery settings) on the Redis at LLM_COUNCIL_TEST_REDIS_URL or
redis://127.0.0.1:6379/9 (a private key prefix, removed afterwards; nothing is flushed):

1. zero latency: median wall per verification for the embedded runner, the Celery runner
   and a bare chain of the same shape (group of N trivial tasks -> group of N -> one task,
   same broker, queue and worker) waited on the usual way (`AsyncResult.get`);
   prints Celery / bare;
2. latency L per call (default 1 s), 4 models: wall / (3 L) for both runners;
3. a burst of B verifications (default 200) submitted at once: verifications per second,
   and the bare chain's rate for B chains; prints the ratio.

Targets (DESIGN.md): Celery runner within 1.5x of the bare chain; wall / (3 L) <= 1.05.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")
CHAIRMAN = "careful-chair"
SQL = """import sqlite3


def find_user(conn: sqlite3.Connection, name: str):
    cur = conn.cursor()
    cur.execute("SELECT * FROM users WHERE name = '%s'" % name)
    return cur.fetchall()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def fake_provider() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.fake_provider", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(url + "/admin/health", timeout=1):
                return True
        except OSError:
            return False

    try:
        _wait(up, 20, "the fake provider")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def configure(url: str, latency_ms: int) -> None:
    """Forget recorded calls (they grow with every run), then set the latency."""
    for path, body in (("/admin/reset", {}), ("/admin/config", {"latency_ms": latency_ms})):
        req = urllib.request.Request(
            url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5):
            pass


@contextlib.contextmanager
def worker(env: dict[str, str], concurrency: int, log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
             "-Q", "council.quick,council.balanced", "-c", str(concurrency), "-P", "prefork",
             "-O", "fair", "-E", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h",
             "--loglevel", "WARNING", "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield None  # the caller waits for the first trivial chain to come back
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--runs", type=int, default=30, help="verifications per zero-latency mode")
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--latency-ms", type=int, default=1000)
    parser.add_argument("--latency-runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)

    from celery import chain, group

    from shared.embedded import run_embedded
    from shared.pipeline import plan_run
    from shared.providers.client import HttpProviderClient, ProviderKeys
    from shared.request import VerifyRequest
    from shared.selection import resolve_subject
    from shared.settings import CouncilSettings
    from tests.helpers import GitRepo
    from worker.celery_app import make_app
    from worker.config import WorkerSettings
    from worker.runner import run_remote, runner_context, submit_remote, wait_for

    redis_url = os.environ.get("LLM_COUNCIL_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
    name = uuid.uuid4().hex[:8]
    prefix, bprefix = f"llmc-bench-{name}:", f"llmc-bench-{name}:b:"
    tmp = Path(tempfile.mkdtemp(prefix="llmc-bench-"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LLM_COUNCIL_")},
        "LLM_COUNCIL_BROKER_URL": redis_url,
        "LLM_COUNCIL_REDIS_URL": redis_url,
        "LLM_COUNCIL_KEY_PREFIX": prefix,
        "LLM_COUNCIL_BROKER_KEY_PREFIX": bprefix,
        "LLM_COUNCIL_WORKER_TIERS": "quick,balanced",
        "PYTHONPATH": str(ROOT),
    }
    ws = WorkerSettings(key_prefix=prefix, broker_key_prefix=bprefix)
    repo = GitRepo(tmp / "repo")
    repo.commit("base", {"README.md": "bench\n"})
    sha = repo.commit("sql", {"app/db.py": SQL})

    with fake_provider() as url, worker(env, args.concurrency, tmp / "worker.log"):
        base = f"openai-compat@{url}/v1"
        settings = CouncilSettings(
            models=[f"{base}:{m}" for m in MEMBERS],
            chairman=f"{base}:{CHAIRMAN}",
            broker_url=redis_url,
            redis_url=redis_url,
            transcript_dir=tmp / "logs",
        )
        subject = resolve_subject(repo.root, sha, None, settings=settings)

        def plan() -> Any:
            request = VerifyRequest(snapshot_id=sha, tier="quick", repo=str(repo.root))
            return plan_run(request, settings, subject)

        client = HttpProviderClient(ProviderKeys.from_settings(settings))
        bare_app = make_app("fast", settings, ws)  # a normal app: waits with .get()
        noop = "council.bench.noop"
        n = len(MEMBERS)

        def bare_chain() -> Any:
            sig = chain(
                group(bare_app.signature(noop, queue="council.quick", immutable=True)
                      for _ in range(n)),
                group(bare_app.signature(noop, queue="council.quick") for _ in range(n)),
                bare_app.signature(noop, queue="council.quick"),
            )  # fmt: skip
            return sig.apply_async()

        def timed(fn: Callable[[], Any], runs: int) -> list[float]:
            out = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out

        # Wait for the worker, and warm every path up.
        bare_chain().get(timeout=60)
        configure(url, 0)
        for _ in range(3):
            run_remote(plan(), settings, options=ws)
            run_embedded(plan(), client)
            bare_chain().get(timeout=30)

        # 1. zero latency, interleaved so load from elsewhere hits all three alike.
        emb: list[float] = []
        cel: list[float] = []
        bare: list[float] = []
        for _ in range(args.runs):
            p1, p2 = plan(), plan()
            emb += timed(partial(run_embedded, p1, client), 1)
            cel += timed(partial(run_remote, p2, settings, options=ws), 1)
            bare += timed(lambda: bare_chain().get(timeout=30), 1)
        e_ms, c_ms, b_ms = median_ms(emb), median_ms(cel), median_ms(bare)

        # 2. latency L, 4 models.
        configure(url, args.latency_ms)
        lat = args.latency_ms / 1000
        emb_l = [t for _ in range(args.latency_runs) for t in timed(
            lambda: run_embedded(plan(), client), 1)]  # fmt: skip
        cel_l = [t for _ in range(args.latency_runs) for t in timed(
            lambda: run_remote(plan(), settings, options=ws), 1)]  # fmt: skip
        configure(url, 0)

        # 3. burst.
        plans = [plan() for _ in range(args.burst)]
        ctx = runner_context(settings, ws)
        t0 = time.perf_counter()
        for p in plans:
            submit_remote(p, settings, options=ws)
        payloads = [wait_for(ctx, p) for p in plans]
        burst_s = time.perf_counter() - t0
        bad = [p for p in payloads if p.verdict.value != "fail"]
        t0 = time.perf_counter()
        results = [bare_chain() for _ in range(args.burst)]
        for r in results:
            r.get(timeout=120)
        bare_burst_s = time.perf_counter() - t0

    print(f"llm-council workflow benchmark ({args.runs} runs each, 4 models, prefork "
          f"-c {args.concurrency}, Redis {redis_url})")  # fmt: skip
    print("zero latency, median wall per verification:")
    print(f"  embedded runner      {e_ms:8.1f} ms")
    print(f"  Celery runner        {c_ms:8.1f} ms")
    print(f"  bare Celery chain    {b_ms:8.1f} ms   ({n}+{n}+1 trivial tasks)")
    print(f"  Celery / bare        {c_ms / b_ms:8.2f} x   (target <= 1.5)")
    print(f"  (Celery - embedded) / bare {(c_ms - e_ms) / b_ms:5.2f} x   (orchestration only: "
          "the council's own work, which the bare chain skips, taken out)")  # fmt: skip
    print(f"provider latency L = {lat:.1f} s, median wall / (3 L):")
    print(
        f"  embedded runner      {statistics.median(emb_l) / (3 * lat):8.3f}     (target <= 1.05)"
    )
    print(
        f"  Celery runner        {statistics.median(cel_l) / (3 * lat):8.3f}     (target <= 1.05)"
    )
    print(f"burst of {args.burst}:")
    print(f"  Celery runner        {args.burst / burst_s:8.1f} verifications/s")
    print(f"  bare Celery chain    {args.burst / bare_burst_s:8.1f} chains/s")
    print(f"  Celery / bare        {burst_s / bare_burst_s:8.2f} x   (time for the burst)")
    if bad:
        print(f"  WARNING: {len(bad)} verifications did not end in the expected FAIL")
    _cleanup(redis_url, (prefix, bprefix))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _cleanup(redis_url: str, prefixes: tuple[str, ...]) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    for prefix in prefixes:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i : i + 1000])


if __name__ == "__main__":
    sys.exit(main())
