"""`llm-council gate` end to end: real git repos, the fake provider over real HTTP."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.e2e.conftest import council_env
from tests.helpers import CLEAN_CODE, SQL_INJECTION

pytestmark = pytest.mark.e2e


def test_planted_sql_injection_fails_with_a_located_critical_finding(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n"})
    sha = repo.commit("add lookup", {"app/db.py": SQL_INJECTION})
    run = gate(
        repo.root,
        "--snapshot",
        sha,
        "--output-format",
        "json",
        env=council_env(fake_provider.openai_base),
    )
    assert run.code == 1, run.stderr
    p = run.payload
    assert p["verdict"] == "fail" and p["exit_code"] == 1
    assert p["coverage"]["reviewed"] == ["app/db.py"]
    crit = [f for f in p["findings"] if f["severity"] == "critical"]
    assert crit and crit[0]["location"] == "app/db.py:6"
    assert p["blocking_issues"] == crit
    assert p["snapshot"]["resolved"] == sha


def test_clean_change_passes(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n"})
    sha = repo.commit("add lookup", {"app/db.py": CLEAN_CODE})
    run = gate(
        repo.root,
        "--snapshot",
        sha,
        "--output-format",
        "json",
        env=council_env(fake_provider.openai_base),
    )
    assert run.code == 0, run.stdout + run.stderr
    p = run.payload
    assert (p["verdict"], p["findings"], p["unclear_reason"]) == ("pass", [], None)
    calls = {
        (c["stage"], c["model"]): c["completed"]
        for c in fake_provider.calls()
        if c["verification"] == p["verification_id"]
    }
    assert calls[("stage1", "careful-1")] == 1
    assert calls[("chairman", "careful-chair")] == 1
    assert sum(1 for stage, _ in calls if stage == "stage2") == 4


def test_text_output_lists_reviewed_files_and_transcript(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("add lookup", {"app/db.py": SQL_INJECTION})
    run = gate(repo.root, env=council_env(fake_provider.openai_base))
    assert run.code == 1
    assert "Reviewed files (1):" in run.stdout and "app/db.py" in run.stdout
    assert "FAIL" in run.stdout and "app/db.py:6" in run.stdout
    location = run.stdout.split("Transcript: ", 1)[1].split()[0]
    folder = Path(location)
    assert {
        "request.json",
        "stage1.json",
        "stage2.json",
        "chairman.json",
        "result.json",
        "integrity.json",
    } <= {p.name for p in folder.iterdir()}
    assert "stage1" in run.stderr  # progress goes to stderr


def test_binary_and_env_only_reviews_nothing_and_exits_3(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("assets", {"logo.png": b"\x89PNG\r\n\x1a\n\x00\x00binary", ".env": "TOKEN=abc\n"})
    run = gate(repo.root, "--output-format", "json", env=council_env(fake_provider.openai_base))
    assert run.code == 3, run.stdout + run.stderr
    p = run.payload
    assert p["error"] == "no_reviewable_content"
    assert p["coverage"]["reviewed"] == []
    reasons = {o["path"]: o["reason"] for o in p["coverage"]["omitted"]}
    assert reasons == {"logo.png": "binary", ".env": "denied_secret"}
    assert not [c for c in fake_provider.calls() if c["verification"] == p["verification_id"]]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_provider_is_unclear_infra_failure(repo, gate):
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("add lookup", {"app/db.py": CLEAN_CODE})
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    run = gate(repo.root, "--output-format", "json", "--tier", "quick", env=council_env(base))
    assert run.code == 2, run.stdout + run.stderr
    p = run.payload
    assert (p["verdict"], p["unclear_reason"]) == ("unclear", "infra_failure")
    assert {f["kind"] for f in p["diagnostics"]["failed_models"].values()} == {"connection"}


def test_merge_commit_reviews_exactly_its_first_parent_diff(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n", "core.py": "X = 1\n"})
    repo.git("checkout", "-q", "-b", "feature")
    repo.commit("feature", {"feature.py": CLEAN_CODE})
    repo.git("checkout", "-q", "main")
    repo.commit("main moves on", {"core.py": "X = 2\n"})
    repo.git("merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    run = gate(repo.root, "--output-format", "json", env=council_env(fake_provider.openai_base))
    assert run.payload["coverage"]["reviewed"] == ["feature.py"], run.stderr


def test_secret_in_committed_env_never_reaches_a_prompt(repo, gate, fake_provider):
    canary = "CANARY-7f3c9a1e-do-not-send"
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("config", {".env": f"API_KEY={canary}\n", "app/db.py": CLEAN_CODE})
    for args in ((), ("--file-paths", ".env", "--file-paths", "app/db.py"), ("--file-paths", ".")):
        run = gate(
            repo.root, "--output-format", "json", *args, env=council_env(fake_provider.openai_base)
        )
        p = run.payload
        assert ".env" not in p["coverage"]["reviewed"]
        assert canary not in run.stdout and canary not in run.stderr
        folder = Path(p["transcript_location"])
        for f in folder.iterdir():
            assert canary not in f.read_text(errors="replace"), f.name
    prompts = json.dumps(fake_provider.prompts())
    assert "app/db.py" in prompts
    assert canary not in prompts


def test_setup_errors_exit_2_with_one_clear_line(tmp_path, repo, gate, fake_provider):
    env = council_env(fake_provider.openai_base)
    not_repo = tmp_path / "plain"
    not_repo.mkdir()
    run = gate(not_repo, env=env)
    assert run.code == 2 and "not a git repository" in run.stderr.lower()
    repo.commit("base", {"a.py": "x = 1\n"})
    run = gate(repo.root, "--snapshot", "no-such-rev", env=env)
    assert run.code == 2 and "no-such-rev" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    run = gate(repo.root, "--tier", "ultra", env=env)
    assert run.code == 2 and "ultra" in run.stderr


def test_no_council_configured_names_what_to_set(repo, gate):
    repo.commit("base", {"a.py": "x = 1\n"})
    run = gate(repo.root)
    assert run.code == 2
    assert "OPENROUTER_API_KEY" in run.stderr and "--offline" in run.stderr


def test_offline_mode_runs_the_bundled_fake_provider(repo, gate):
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("add lookup", {"app/db.py": SQL_INJECTION})
    run = gate(repo.root, "--offline")
    assert run.code == 1, run.stderr
    assert "Offline reviewers (bundled fake provider)" in run.stdout
    run = gate(repo.root, "--offline", "--output-format", "json")
    assert run.payload["offline"] is True


def test_gate_refuses_explicit_warn_policy(repo, gate, fake_provider):
    repo.commit("base", {"a.py": "x = 1\n"})
    env = {**council_env(fake_provider.openai_base), "LLM_COUNCIL_COVERAGE_POLICY": "warn"}
    run = gate(repo.root, env=env)
    assert run.code == 2 and "warn" in run.stderr


def test_provider_answering_only_402_exits_2_naming_billing(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("add lookup", {"app/db.py": CLEAN_CODE})
    fake_provider.configure(faults={"*": {"behaviour": "billing402"}})
    run = gate(repo.root, env=council_env(fake_provider.openai_base))
    assert run.code == 2, run.stdout + run.stderr
    assert "UNCLEAR (infra_failure)" in run.stdout
    assert "billing" in run.stdout.lower()
    assert "Retry hint" not in run.stdout  # a genuine infra failure gets no hint
