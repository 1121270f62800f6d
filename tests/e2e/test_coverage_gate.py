"""What gets reviewed, seen through `llm-council gate`: the canary, the clamp, the policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import council_env
from tests.helpers import CLEAN_CODE

pytestmark = pytest.mark.e2e

SECRET_FILES = (
    ".env",
    "config/.ENV.production",
    "deploy/server.PEM",
    "tls/site.key",
    "home/.ssh/id_rsa",
    "home/.ssh/id_ed25519",
    ".npmrc",
    ".pypirc",
    ".netrc",
    ".git-credentials",
    ".aws/credentials",
    "ops/kubeconfig",
    "ops/prod.kubeconfig",
    "charts/secrets.yaml",
    "gcp/credentials.json",
    "certs/client.p12",
    "certs/client.pfx",
)


def _canary(i: int) -> str:
    return f"CANARY-{i:02d}-9b1f2e7d"


def test_no_secret_reaches_a_prompt_a_transcript_or_the_output(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n"})
    files: dict[str, str | bytes] = {
        path: f"value={_canary(i)}\n" for i, path in enumerate(SECRET_FILES)
    }
    files["app/db.py"] = CLEAN_CODE
    files[".env.example"] = "API_KEY=<your key here>\n"
    repo.commit("secrets everywhere", files)
    env = council_env(fake_provider.openai_base)
    requests = [
        (),  # the changed set
        tuple(arg for p in SECRET_FILES for arg in ("--file-paths", p)),  # named explicitly
        ("--file-paths", "."),  # a directory
    ]
    outputs = []
    for args in requests:
        run = gate(repo.root, "--output-format", "json", *args, env=env)
        outputs.append(run.stdout + run.stderr)
        p = run.payload
        omitted = {o["path"]: o["reason"] for o in p["coverage"]["omitted"]}
        for path in SECRET_FILES:
            assert omitted.get(path) == "denied_secret", (args[:2], path)
        if not args or args[1] == ".":
            assert ".env.example" in p["coverage"]["reviewed"]
        assert p["verdict"] != "pass"  # a denied secret among the changed files clamps a pass
    everything = "\n".join(outputs) + json.dumps(fake_provider.prompts())
    logs = repo.root / ".council" / "logs"
    for f in logs.rglob("*"):
        if f.is_file():
            everything += f.read_text(errors="replace")
    assert "app/db.py" in everything
    for i in range(len(SECRET_FILES)):
        assert _canary(i) not in everything


@pytest.fixture
def zig_commit(repo):
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("zig", {"app/db.py": CLEAN_CODE, "src/main.zig": "pub fn main() void {}\n"})
    return repo


def test_content_selection_reviews_unlisted_languages(zig_commit, gate, fake_provider):
    run = gate(
        zig_commit.root, "--output-format", "json", env=council_env(fake_provider.openai_base)
    )
    assert run.code == 0, run.stdout
    assert sorted(run.payload["coverage"]["reviewed"]) == ["app/db.py", "src/main.zig"]


def test_an_unreviewed_changed_file_can_no_longer_pass(zig_commit, gate, fake_provider):
    env = {**council_env(fake_provider.openai_base), "LLM_COUNCIL_FILE_SELECTION": "allowlist"}
    run = gate(zig_commit.root, "--output-format", "json", env=env)
    assert run.code == 2, run.stdout
    p = run.payload
    assert (p["verdict"], p["unclear_reason"]) == ("unclear", "incomplete_coverage")
    assert p["diagnostics"]["inner_verdict"] == "pass"
    assert [(o["path"], o["reason"]) for o in p["coverage"]["clamped"]] == [
        ("src/main.zig", "non-text")
    ]
    text = gate(zig_commit.root, env=env)
    assert "Coverage clamp" in text.stdout and "src/main.zig" in text.stdout


def test_acknowledging_the_reason_lets_it_pass(zig_commit, gate, fake_provider):
    env = {
        **council_env(fake_provider.openai_base),
        "LLM_COUNCIL_FILE_SELECTION": "allowlist",
        "LLM_COUNCIL_COVERAGE_ACK_REASONS": "binary,generated,vendored,non-text",
    }
    run = gate(zig_commit.root, "--output-format", "json", env=env)
    assert run.code == 0, run.stdout
    assert run.payload["coverage"]["clamped"] is None


def test_fail_policy_is_a_setup_error(zig_commit, gate, fake_provider):
    env = {
        **council_env(fake_provider.openai_base),
        "LLM_COUNCIL_FILE_SELECTION": "allowlist",
        "LLM_COUNCIL_COVERAGE_POLICY": "fail",
    }
    run = gate(zig_commit.root, env=env)
    assert run.code == 2
    assert "src/main.zig" in run.stderr
    assert run.stdout == ""


def test_oversize_subject_does_not_run_the_council(repo, gate, fake_provider):
    repo.commit("base", {"README.md": "demo\n"})
    big = "".join(f"VALUE_{i} = {i}\n" for i in range(1500))  # ~20K chars, quick allows 15K
    repo.commit("big", {"app/big.py": big, "app/db.py": CLEAN_CODE})
    run = gate(
        repo.root,
        "--tier",
        "quick",
        "--output-format",
        "json",
        env=council_env(fake_provider.openai_base),
    )
    assert run.code == 2
    p = run.payload
    assert (p["verdict"], p["error"]) == ("unclear", "input_too_large")
    assert "over this tier's limit" in p["error_message"] and "app/big.py" in p["error_message"]
    assert not [c for c in fake_provider.calls() if c["verification"] == p["verification_id"]]
    assert (Path(p["transcript_location"]) / "result.json").is_file()
