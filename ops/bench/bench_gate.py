"""Benchmark the embedded gate path.

Prints, from one run on this machine:
- whole-process `llm-council gate --offline` wall time at zero provider latency (median of
  N runs) and its ratio to the 0.35 s target;
- with provider latency L (default 1 s) and 4 models: wall / (3 L) for the in-process
  embedded runner (target <= 1.05) and for the whole CLI process (target <= 1.08).

Run: .venv/bin/python -m ops.bench.bench_gate [--runs 7] [--latency-ms 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ops.fake_provider.server import FakeProvider

CLI = str(Path(sys.executable).with_name("llm-council"))
TARGET_OFFLINE_S = 0.35
MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")


def _git(repo: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
    }
    subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README.md").write_text("bench\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    (repo / "app.py").write_text("def add(a: int, b: int) -> int:\n    return a + b\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "change")
    return repo


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_COUNCIL_")}
    env.update(extra or {})
    return env


def time_cli(repo: Path, args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([CLI, "gate", *args], cwd=repo, env=env, capture_output=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1, 2):
        raise SystemExit(f"gate failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return wall


def time_in_process(repo: Path, base: str) -> float:
    from shared.embedded import run_embedded
    from shared.pipeline import plan_run
    from shared.providers.client import HttpProviderClient
    from shared.request import VerifyRequest
    from shared.selection import resolve_subject
    from shared.settings import load_settings

    settings = load_settings(
        repo,
        models=[f"openai-compat@{base}:{m}" for m in MEMBERS],
        chairman=f"openai-compat@{base}:careful-chair",
    )
    start = time.perf_counter()
    subject = resolve_subject(repo, "HEAD", None, settings=settings)
    plan = plan_run(VerifyRequest(), settings, subject)
    run_embedded(plan, HttpProviderClient.from_settings(settings))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--latency-ms", type=int, default=1000)
    args = parser.parse_args()
    latency = args.latency_ms / 1000
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp))
        time_cli(repo, ["--offline"], clean_env())  # warm the bytecode cache
        offline = [time_cli(repo, ["--offline"], clean_env()) for _ in range(args.runs)]
        med = statistics.median(offline)
        print(
            f"gate --offline, zero latency: median {med:.3f} s over {args.runs} runs "
            f"(min {min(offline):.3f}); ratio to the {TARGET_OFFLINE_S} s target: "
            f"{med / TARGET_OFFLINE_S:.2f}"
        )
        with FakeProvider() as fake:
            fake.configure(latency_ms=args.latency_ms)
            base = fake.openai_base
            in_proc = statistics.median(time_in_process(repo, base) for _ in range(3))
            env = clean_env(
                {
                    "LLM_COUNCIL_MODELS": ",".join(f"openai-compat@{base}:{m}" for m in MEMBERS),
                    "LLM_COUNCIL_CHAIRMAN": f"openai-compat@{base}:careful-chair",
                }
            )
            cli = statistics.median(time_cli(repo, [], env) for _ in range(3))
        print(
            f"L = {latency:.2f} s, 4 models, embedded in-process: wall {in_proc:.3f} s, "
            f"wall/(3L) = {in_proc / (3 * latency):.3f} (target <= 1.05)"
        )
        print(
            f"L = {latency:.2f} s, 4 models, whole CLI process:   wall {cli:.3f} s, "
            f"wall/(3L) = {cli / (3 * latency):.3f} (target <= 1.08)"
        )


if __name__ == "__main__":
    main()
