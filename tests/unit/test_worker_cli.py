"""The operator commands' checks, and that registering them costs the gate nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.mark.parametrize("command", [["worker"], ["flower", "--no-auth"], ["watchdog"],
                                     ["metrics", "--once"]])  # fmt: skip
def test_commands_need_a_broker(runner, command):
    result = runner.invoke(app, command, env={"LLM_COUNCIL_BROKER_URL": ""})
    assert result.exit_code == 2
    assert "LLM_COUNCIL_BROKER_URL" in result.output


def test_worker_rejects_unknown_and_mixed_tiers(runner):
    env = {"LLM_COUNCIL_BROKER_URL": "redis://127.0.0.1:6379/0"}
    result = runner.invoke(app, ["worker", "--tiers", "quick,turbo"], env=env)
    assert result.exit_code == 2 and "unknown tier 'turbo'" in result.output
    result = runner.invoke(app, ["worker", "--tiers", "balanced,reasoning"], env=env)
    assert result.exit_code == 2 and "span two tier groups" in result.output


@pytest.mark.parametrize("auth", ["", "nopassword", "user:", ":pass"])
def test_flower_refuses_without_valid_basic_auth(runner, auth):
    env = {"LLM_COUNCIL_BROKER_URL": "redis://127.0.0.1:6379/0",
           "LLM_COUNCIL_FLOWER_BASIC_AUTH": auth}  # fmt: skip
    result = runner.invoke(app, ["flower"], env=env)
    assert result.exit_code == 2
    assert "LLM_COUNCIL_FLOWER_BASIC_AUTH" in result.output


def test_registering_the_worker_commands_imports_nothing_heavy():
    code = (
        "import sys, api.cli;"
        "heavy = {'celery', 'kombu', 'redis', 'flower', 'prometheus_client', 'worker'} & "
        "{m.split('.')[0] for m in sys.modules}; print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_flower_passes_the_broker_api_and_auth(runner, monkeypatch):
    import api.cli_worker as cli_worker

    seen: dict = {}
    monkeypatch.setattr(cli_worker, "_exec", lambda argv, env: seen.update(argv=argv, env=env))
    env = {"LLM_COUNCIL_BROKER_URL": "amqp://u:p@127.0.0.1:5672//",
           "LLM_COUNCIL_FLOWER_BASIC_AUTH": "admin:secret1"}  # fmt: skip
    api_url = "http://u:p@127.0.0.1:15672/api/"
    result = runner.invoke(app, ["flower", "--broker-api", api_url], env=env)
    assert result.exit_code == 0, result.output
    assert f"--broker-api={api_url}" in seen["argv"]
    assert seen["env"]["FLOWER_BASIC_AUTH"] == "admin:secret1"
