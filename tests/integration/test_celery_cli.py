"""The operator commands and the gate through a broker, run as a user would."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import SQL_INJECTION
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    ROOT,
    commit_change,
    wait_until,
)

pytestmark = pytest.mark.integration
celery_stack = worker_fixtures.celery_stack  # the fixture, for this module's tests

CLI = str(Path(sys.executable).with_name("llm-council"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(args, env, cwd=ROOT, timeout=120):
    return subprocess.run(
        [CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _transcripts(repo_root: Path) -> list[Path]:
    logs = repo_root / ".council" / "logs"
    return [p for p in logs.iterdir() if any(p.iterdir())] if logs.is_dir() else []


def test_broker_unreachable_at_enqueue_is_one_line_exit_2_and_nothing_written(celery_stack, repo):
    sha = commit_change(repo, SQL_INJECTION)
    closed = _free_port()
    env = celery_stack.env(LLM_COUNCIL_BROKER_URL=f"redis://127.0.0.1:{closed}/0")
    out = _run(["gate", "--offline", "--snapshot", sha, "--repo", str(repo.root)], env)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(
        f"llm-council: cannot reach the Celery broker at redis://127.0.0.1:{closed}/0"
    )
    assert "LLM_COUNCIL_BROKER_URL" in lines[0]
    assert out.stdout == ""
    assert _transcripts(repo.root) == []
    assert celery_stack.own_keys() == []


def test_gate_through_a_broker_and_worker_matches_the_embedded_verdict(celery_stack, repo):
    sha = commit_change(repo, SQL_INJECTION)
    env = celery_stack.env()
    worker = subprocess.Popen(
        [CLI, "worker", "--tiers", "quick,balanced", "--concurrency", "4", "--hostname",
         "cli@%h"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        os.set_blocking(worker.stdout.fileno(), False)
        seen = bytearray()

        def ready() -> bool:
            assert worker.poll() is None, seen.decode(errors="replace")
            chunk = worker.stdout.read()  # type: ignore[union-attr]
            if chunk:
                seen.extend(chunk)
            return b" ready." in seen

        wait_until(ready, 60, "`llm-council worker` to be ready", step=0.1)
        args = ["gate", "--offline", "--snapshot", sha, "--tier", "quick",
                "--output-format", "json", "--repo", str(repo.root)]  # fmt: skip
        remote = _run(args, env)
        embedded_env = {k: v for k, v in env.items() if k != "LLM_COUNCIL_BROKER_URL"}
        embedded = _run(args, embedded_env)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    assert remote.returncode == embedded.returncode == 1, remote.stderr + embedded.stderr
    a, b = json.loads(remote.stdout), json.loads(embedded.stdout)
    assert (a["runner"], b["runner"]) == ("celery", "embedded")
    for field in ("verdict", "exit_code", "findings", "blocking_issues", "completed_stages",
                  "coverage", "unclear_reason"):  # fmt: skip
        assert a[field] == b[field], field


def test_worker_refuses_tiers_of_two_groups(celery_stack):
    out = _run(["worker", "--tiers", "quick,high"], celery_stack.env())
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "span two tier groups" in out.stderr


def test_flower_needs_basic_auth_and_serves_with_it(celery_stack):
    env = celery_stack.env()
    env.pop("LLM_COUNCIL_FLOWER_BASIC_AUTH", None)
    refused = _run(["flower", "--port", str(_free_port())], env)
    assert refused.returncode == 2
    assert "LLM_COUNCIL_FLOWER_BASIC_AUTH" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    port = _free_port()
    env["LLM_COUNCIL_FLOWER_BASIC_AUTH"] = "ops:s3cret"
    proc = subprocess.Popen(
        [CLI, "flower", "--port", str(port)], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def status(path: str, auth: str | None = None) -> int:
        request = urllib.request.Request(base + path)
        if auth:
            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    try:
        wait_until(lambda: status("/healthcheck") == 200, 60, "flower to answer")
        assert status("/") == 401
        assert status("/api/workers") == 401
        assert status("/", "ops:wrong") == 401
        assert status("/", "ops:s3cret") == 200
        assert "s3cret" not in " ".join(Path(f"/proc/{proc.pid}/cmdline").read_text().split("\0"))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_metrics_report_queue_depth_per_tier_queue(celery_stack, fake_provider):
    from worker.celery_app import get_app

    settings = celery_stack.settings(fake_provider)
    app = get_app("fast", settings, celery_stack.worker_settings())
    for _ in range(3):
        app.send_task("council.bench.noop", queue="council.quick")
    app.send_task("council.bench.noop", queue="council.balanced")
    out = _run(["metrics", "--once"], celery_stack.env())
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert 'llm_council_queue_depth{group="fast",queue="council.quick"} 3.0' in text
    assert 'llm_council_queue_depth{group="fast",queue="council.balanced"} 1.0' in text
    assert 'llm_council_queue_depth{group="slow",queue="council.reasoning"} 0.0' in text
    assert 'llm_council_metrics_up{target="broker:fast"} 1.0' in text
    assert 'llm_council_metrics_up{target="store"} 1.0' in text
    assert "llm_council_verifications_active 0.0" in text


def test_metrics_exporter_serves_http(celery_stack):
    port = _free_port()
    proc = subprocess.Popen(
        [CLI, "metrics", "--port", str(port)], cwd=ROOT, env=celery_stack.env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return str(resp.read().decode())
        except OSError:
            return ""

    try:
        body = wait_until(scrape, 30, "the metrics exporter")
        assert "llm_council_queue_depth" in body
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    time.sleep(0)
