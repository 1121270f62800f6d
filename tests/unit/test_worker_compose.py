"""docker-compose.yml, validated without a Docker engine: services, healthchecks, and every
command it runs exists in this project."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from shared.settings import CouncilSettings
from shared.tiers import Tier
from worker.config import GROUPS, WorkerSettings, consumer_timeout_problem, longest_task_s

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
RABBIT_OVERRIDE = ROOT / "docker-compose.rabbitmq.yml"
RABBIT_CONF = ROOT / "ops" / "rabbitmq" / "rabbitmq.conf"
ENV_EXAMPLE = ROOT / ".env.example"
#: Programs the images themselves provide (redis, postgres, rabbitmq).
IMAGE_PROGRAMS = {"redis-server", "redis-cli", "pg_isready", "rabbitmq-diagnostics"}
#: Services that talk to the broker: the RabbitMQ override must switch every one of them.
BROKER_CLIENTS = {"worker-fast", "worker-slow", "flower", "flower-slow", "metrics", "api"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def cli() -> Any:
    from api.cli import app

    group = typer.main.get_command(app)
    assert hasattr(group, "commands")
    return group


def _argv(command: Any) -> list[str]:
    if isinstance(command, str):
        return shlex.split(command)
    return [str(part) for part in command]


def _healthcheck_argv(check: dict[str, Any]) -> list[str]:
    test = check["test"]
    if isinstance(test, str):
        return shlex.split(test)
    kind, *rest = test
    if kind == "CMD-SHELL":
        return shlex.split(rest[0].replace("$$", "$"))
    assert kind == "CMD", test
    return [str(x) for x in rest]


def _check_command(argv: list[str], cli: Any, where: str) -> None:
    program, *args = argv
    if program == "llm-council":
        name, *opts = args
        assert name in cli.commands, f"{where}: llm-council has no command {name!r}"
        known = {o for p in cli.commands[name].params for o in getattr(p, "opts", [])}
        for opt in opts:
            if opt.startswith("--"):
                assert opt.split("=", 1)[0] in known, f"{where}: {name} has no option {opt}"
    elif program == "python" and args[:1] == ["-m"]:
        module = args[1]
        assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
        assert importlib.util.find_spec(f"{module}.__main__") is not None or module.endswith(
            "__main__"
        ), f"{where}: {module} cannot run with -m"
    elif program == "python" and args[:1] == ["-c"]:
        compile(args[1], where, "exec")
    elif program == "celery":
        assert args[:2] == ["-A", "worker.celery_app"], f"{where}: unexpected celery app"
        assert importlib.util.find_spec("worker.celery_app") is not None
    else:
        assert program in IMAGE_PROGRAMS, f"{where}: unknown program {program!r}"


def test_services_and_healthchecks(services):
    expected = {"redis", "postgres", "fake-provider", "worker-fast", "worker-slow", "flower",
                "metrics", "api"}  # fmt: skip
    assert expected <= set(services)
    for name, svc in services.items():
        assert "healthcheck" in svc, f"{name} has no healthcheck"
        assert svc["healthcheck"]["test"], name


def test_redis_keeps_an_append_only_file(services):
    argv = _argv(services["redis"]["command"])
    assert argv[0] == "redis-server"
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])


def test_every_command_exists_in_the_project(services, cli):
    for name, svc in services.items():
        if "command" in svc:
            _check_command(_argv(svc["command"]), cli, f"{name}.command")
        _check_command(_healthcheck_argv(svc["healthcheck"]), cli, f"{name}.healthcheck")


def test_workers_are_split_by_tier_group(services):
    def tiers_of(svc: dict[str, Any]) -> str:
        argv = _argv(svc["command"])
        return argv[argv.index("--tiers") + 1]

    fast, slow = services["worker-fast"], services["worker-slow"]
    assert tiers_of(fast) == "quick,balanced"
    assert tiers_of(slow) == "high,reasoning"
    assert fast["environment"]["LLM_COUNCIL_WORKER_TIERS"] == "quick,balanced"
    assert slow["environment"]["LLM_COUNCIL_WORKER_TIERS"] == "high,reasoning"
    assert "council-fast@" in _healthcheck_argv(fast["healthcheck"])[-1]
    assert "council-slow@" in _healthcheck_argv(slow["healthcheck"])[-1]


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", text)
    assert match, text
    return float(match.group(1)) * (60 if match.group(2) == "m" else 1)


def test_shutdown_leaves_running_calls_time_to_finish_or_be_handed_back(services):
    fast, slow = services["worker-fast"], services["worker-slow"]
    assert fast["stop_signal"] == "SIGTERM"
    # Warm shutdown: the longest quick/balanced task must fit in the grace period.
    assert _seconds(fast["stop_grace_period"]) >= longest_task_s(Tier.BALANCED)
    # Reasoning tasks are too long to wait for: soft shutdown, then hand the messages back.
    env = slow["environment"]
    assert env["REMAP_SIGTERM"] == "SIGQUIT"
    assert float(env["LLM_COUNCIL_SOFT_SHUTDOWN_TIMEOUT"]) < _seconds(slow["stop_grace_period"])


def test_flower_requires_auth_from_the_environment(services):
    for name in ("flower", "flower-slow"):
        argv = _argv(services[name]["command"])
        assert argv[:2] == ["llm-council", "flower"] and "--no-auth" not in argv
    assert "LLM_COUNCIL_FLOWER_BASIC_AUTH=" in ENV_EXAMPLE.read_text()


def test_api_service_runs_serve_with_a_healthz_check(services):
    api = services["api"]
    argv = _argv(api["command"])
    assert argv[:2] == ["llm-council", "serve"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == "8000"
    assert "/healthz" in " ".join(_healthcheck_argv(api["healthcheck"]))
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_env_example_has_every_variable_and_no_real_secret(compose, services):
    env = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    referenced = set(re.findall(r"\$\{(\w+)", COMPOSE.read_text() + RABBIT_OVERRIDE.read_text()))
    assert referenced <= set(env), referenced - set(env)
    for key in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        assert env[key] == "", f"{key} must be empty in the example"
    for key, value in env.items():
        if any(word in key for word in ("PASSWORD", "TOKEN", "AUTH")):
            assert "change-me" in value, f"{key} must hold a placeholder"
    assert "change-me" in env["LLM_COUNCIL_DATABASE_URL"]
    for name, svc in services.items():
        if "build" in svc:
            assert svc.get("env_file") == ".env", name


def test_dockerfile_exists_and_copies_existing_paths(services):
    dockerfiles = {svc["build"]["dockerfile"] for svc in services.values() if "build" in svc}
    assert dockerfiles == {"ops/Dockerfile"}
    text = (ROOT / "ops" / "Dockerfile").read_text()
    for src in re.findall(r"^COPY (.+) \S+$", text, flags=re.M):
        for path in src.split():
            assert (ROOT / path).exists(), path


# --- RabbitMQ override ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rabbit() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(RABBIT_OVERRIDE.read_text())
    assert isinstance(data, dict)
    return data["services"]


def _conf_value(name: str) -> str:
    for line in RABBIT_CONF.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#") and key.strip() == name:
            return value.strip()
    raise AssertionError(f"{name} is not set in {RABBIT_CONF}")


def test_rabbitmq_service_has_management_config_and_healthcheck(rabbit, cli):
    mq = rabbit["rabbitmq"]
    assert "management" in mq["image"]
    assert "127.0.0.1:15672:15672" in mq["ports"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in mq["volumes"]}
    assert mounts["./ops/rabbitmq/rabbitmq.conf"].startswith("/etc/rabbitmq/conf.d/")
    assert (ROOT / "ops" / "rabbitmq" / "rabbitmq.conf").exists()
    _check_command(_healthcheck_argv(mq["healthcheck"]), cli, "rabbitmq.healthcheck")
    assert "PASSWORD" in mq["environment"]["RABBITMQ_DEFAULT_PASS"]


def test_override_switches_every_broker_client_to_rabbitmq(rabbit, services):
    assert set(rabbit) - {"rabbitmq"} == BROKER_CLIENTS
    assert set(services) >= BROKER_CLIENTS
    for name in BROKER_CLIENTS:
        env = rabbit[name]["environment"]
        assert env["LLM_COUNCIL_BROKER_URL"].startswith("amqp://"), name
        assert "@rabbitmq:5672/" in env["LLM_COUNCIL_BROKER_URL"], name
        assert rabbit[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name
    for name in ("flower", "flower-slow"):
        # Flower's --broker-api, through its environment: the management HTTP API.
        assert rabbit[name]["environment"]["FLOWER_BROKER_API"].endswith("@rabbitmq:15672/api/")


def test_consumer_timeout_covers_every_task_and_workers_are_told_it(rabbit):
    timeout_ms = int(_conf_value("consumer_timeout"))
    for name in ("worker-fast", "worker-slow"):
        told = float(rabbit[name]["environment"]["LLM_COUNCIL_RABBITMQ_CONSUMER_TIMEOUT_S"])
        assert told * 1000 == timeout_ms, name
    ws = WorkerSettings(rabbitmq_consumer_timeout_s=timeout_ms / 1000)
    settings = CouncilSettings(broker_url="amqp://council:pw@rabbitmq:5672/council")
    for group in GROUPS:
        assert consumer_timeout_problem(group, settings, ws) is None
    # "Well above" the longest task: room for a timeout multiplier of 2.
    assert timeout_ms / 1000 > 2 * longest_task_s(Tier.REASONING) + 30
    assert int(_conf_value("heartbeat")) >= WorkerSettings().broker_heartbeat_s
