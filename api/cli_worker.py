"""Operator commands for the Celery side: `worker`, `flower`, `metrics`, `watchdog`.

Everything heavy (celery, kombu, redis, flower, prometheus_client, the worker package) is
imported inside the command bodies: registering these commands must not slow down or
weigh on `llm-council gate`.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer

EXIT_SETUP = 2
FLOWER_AUTH_ENV = "LLM_COUNCIL_FLOWER_BASIC_AUTH"


def _fail(message: str) -> NoReturn:
    typer.echo(f"llm-council: {message}", err=True)
    raise typer.Exit(EXIT_SETUP)


def _settings():  # type: ignore[no-untyped-def]
    from shared.settings import SettingsError, load_settings

    try:
        return load_settings()
    except SettingsError as exc:
        _fail(str(exc))


def _group(tiers: str) -> tuple[str, str]:
    """(group, comma-separated queue names) for `--tiers`."""
    from worker.config import group_for_tiers, parse_tiers, queue_name

    try:
        parsed = parse_tiers(tiers)
        group = group_for_tiers(parsed)
    except ValueError as exc:
        _fail(str(exc))
    return group, ",".join(queue_name(t) for t in parsed)


def _exec(argv: list[str], env: dict[str, str]) -> NoReturn:
    """Replace this process, so signals (SIGTERM for a warm shutdown) reach Celery itself."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


def worker(
    tiers: Annotated[
        str, typer.Option(help="Tiers to serve (one group): quick,balanced or high,reasoning.")
    ] = "quick,balanced",
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Pool processes (default 8: calls are I/O-bound).")
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info",
    hostname: Annotated[
        str | None, typer.Option(help="Worker node name (default council-<group>@<host>).")
    ] = None,
) -> None:
    """Start a prefork Celery worker, with task events, on the tiers' queues."""
    group, queues = _group(tiers)
    settings = _settings()
    if not settings.broker_url:
        _fail("no broker configured: set LLM_COUNCIL_BROKER_URL (e.g. redis://127.0.0.1:6379/0)")
    from worker.config import DEFAULT_CONCURRENCY

    argv = [
        sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
        "-Q", queues,
        "-c", str(concurrency or DEFAULT_CONCURRENCY),
        "-P", "prefork",
        "-O", "fair",
        "-E",
        "-n", hostname or f"council-{group}@%h",
        "--loglevel", loglevel,
    ]  # fmt: skip
    _exec(argv, {**os.environ, "LLM_COUNCIL_WORKER_TIERS": tiers})


def _check_basic_auth(value: str) -> str:
    pairs = [p.strip() for p in value.split(",") if p.strip()]
    if not pairs or any(":" not in p or not all(p.split(":", 1)) for p in pairs):
        _fail(f"{FLOWER_AUTH_ENV} must be user:password (comma-separated for several users)")
    return ",".join(pairs)


def flower(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 5555,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    tiers: Annotated[
        str, typer.Option(help="Which tier group's broker to watch (one group per Flower).")
    ] = "quick,balanced",
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="Start without basic auth (trusted networks only).")
    ] = False,
    broker_api: Annotated[
        str | None,
        typer.Option(
            "--broker-api",
            help="RabbitMQ management API URL for Flower's broker tab "
            "(e.g. http://user:pass@rabbitmq:15672/api/).",
        ),
    ] = None,
) -> None:
    """Start Flower on a tier group's broker, with basic auth from LLM_COUNCIL_FLOWER_BASIC_AUTH."""
    _group(tiers)
    settings = _settings()
    if not settings.broker_url:
        _fail("no broker configured: set LLM_COUNCIL_BROKER_URL")
    env = {**os.environ, "LLM_COUNCIL_WORKER_TIERS": tiers}
    env.pop("FLOWER_BASIC_AUTH", None)
    auth = os.environ.get(FLOWER_AUTH_ENV, "").strip()
    if auth:
        env["FLOWER_BASIC_AUTH"] = _check_basic_auth(auth)
    elif not no_auth:
        _fail(
            f"flower refuses to start without basic auth: set {FLOWER_AUTH_ENV}=user:password "
            "(or pass --no-auth on a trusted network)"
        )
    argv = [
        sys.executable, "-m", "celery", "-A", "worker.celery_app", "flower",
        f"--port={port}", f"--address={address}",
    ]  # fmt: skip
    if broker_api:
        argv.append(f"--broker-api={broker_api}")
    _exec(argv, env)


def metrics(
    port: Annotated[int, typer.Option(help="Port to serve /metrics on.")] = 9808,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    once: Annotated[
        bool, typer.Option("--once", help="Print the metrics once to stdout and exit.")
    ] = False,
) -> None:
    """Serve Prometheus metrics: queue depth per tier queue, verifications in flight."""
    settings = _settings()
    if not settings.broker_url:
        _fail("no broker configured: set LLM_COUNCIL_BROKER_URL")
    from worker.config import WorkerSettings
    from worker.metrics import render, serve

    ws = WorkerSettings()
    if once:
        sys.stdout.write(render(settings, ws).decode())
        return
    typer.echo(f"llm-council metrics on http://{address}:{port}/metrics", err=True)
    serve(settings, ws, address=address, port=port)


def watchdog() -> None:
    """Close every verification past its deadline without a payload (one sweep)."""
    settings = _settings()
    if not settings.broker_url:
        _fail("no broker configured: set LLM_COUNCIL_BROKER_URL")
    from worker.runner import close_expired

    try:
        closed = close_expired(settings)
    except ConnectionError as exc:
        _fail(str(exc))
    except Exception as exc:
        from redis.exceptions import RedisError

        if isinstance(exc, RedisError):
            _fail(f"cannot reach the Redis store: {exc}")
        raise
    for payload in closed:
        reason = payload.unclear_reason.value if payload.unclear_reason else "-"
        typer.echo(f"{payload.verification_id} {payload.verdict.value} {reason}")
    typer.echo(f"watchdog: closed {len(closed)} verification(s)", err=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`. Keep heavy imports inside the commands."""
    app.command("worker")(worker)
    app.command("flower")(flower)
    app.command("metrics")(metrics)
    app.command("watchdog")(watchdog)
