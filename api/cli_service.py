"""`llm-council serve | mcp | audit | history`.

Every heavy import (FastAPI, uvicorn, SQLModel, the MCP SDK) happens inside a command body,
so `llm-council gate` never pays for them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

EXIT_SETUP = 2


def _fail(message: str) -> typer.Exit:
    typer.echo(f"llm-council: {message}", err=True)
    return typer.Exit(EXIT_SETUP)


def _settings(repo: Path) -> Any:
    from shared.settings import SettingsError, load_settings

    try:
        return load_settings(repo.resolve())
    except SettingsError as exc:
        raise _fail(str(exc)) from None


def _store(settings: Any, repo: Path) -> Any:
    from api.db.engine import DatabaseError, open_database
    from api.db.repository import VerificationStore

    try:
        return VerificationStore(open_database(settings, repo.resolve()))
    except DatabaseError as exc:
        raise _fail(str(exc)) from None


def _bases(settings: Any, repo: Path) -> list[Path]:
    from shared.pipeline import transcript_base

    return [transcript_base(settings, repo.resolve())]


RepoOpt = Annotated[Path, typer.Option("--repo", help="Repository (and working directory) to use.")]


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`. Keep heavy imports inside the commands."""

    @app.command()
    def serve(
        host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
        repo: RepoOpt = Path("."),
        max_body_bytes: Annotated[
            int,
            typer.Option(
                envvar="LLM_COUNCIL_API_MAX_BODY_BYTES",
                min=1024,
                help="Refuse request bodies larger than this (413).",
            ),
        ] = 4 * 1024 * 1024,
        concurrency: Annotated[
            int,
            typer.Option(
                envvar="LLM_COUNCIL_API_CONCURRENCY",
                min=1,
                help="Embedded runs carried out at once (no broker).",
            ),
        ] = 8,
        log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    ) -> None:
        """Serve the HTTP API (/v1/council/..., /healthz, /metrics) with uvicorn."""
        import uvicorn

        from api.app import create_app
        from api.db.engine import DatabaseError

        home = repo.resolve()
        settings = _settings(home)
        try:
            os.chdir(home)  # relative paths (bundle transcripts, SQLite) live here
        except OSError as exc:
            raise _fail(f"cannot use --repo {repo}: {exc.strerror}") from None
        try:
            app_ = create_app(
                settings,
                max_body_bytes=max_body_bytes,
                embedded_concurrency=concurrency,
                base_dir=home,
            )
        except DatabaseError as exc:
            raise _fail(str(exc)) from None
        uvicorn.run(app_, host=host, port=port, log_level=log_level)

    @app.command("mcp")
    def mcp_command(
        transport: Annotated[
            str, typer.Option(help="stdio (what agents launch) or http (streamable HTTP).")
        ] = "stdio",
        host: Annotated[str, typer.Option(help="Interface for --transport http.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port for --transport http.")] = 8765,
        client_budget: Annotated[
            float | None,
            typer.Option(
                help="Seconds the MCP client waits for a tool call (its MCP_TIMEOUT / 1000). "
                "verify blocks only for tiers whose deadline fits. Default 90, or "
                "LLM_COUNCIL_MCP_CLIENT_BUDGET.",
            ),
        ] = None,
        repo: RepoOpt = Path("."),
    ) -> None:
        """Serve the MCP tools verify, verify_status and audit."""
        from api.db.engine import DatabaseError
        from api.mcp_server import build_server, client_budget_from_env, http_app, run_stdio
        from api.service import VerificationService

        if transport not in ("stdio", "http"):
            raise _fail(f"--transport must be stdio or http, not {transport!r}")
        if client_budget is not None and client_budget <= 0:
            raise _fail("--client-budget must be positive")
        root = repo.resolve()
        settings = _settings(root)
        try:
            os.chdir(root)  # relative paths (transcripts, SQLite) live here
        except OSError as exc:
            raise _fail(f"cannot use --repo {repo}: {exc.strerror}") from None
        try:
            budget = client_budget or client_budget_from_env()
            store = _store(settings, root)
        except (ValueError, DatabaseError) as exc:
            raise _fail(str(exc)) from None
        service = VerificationService(settings, store, default_roots=(root,))
        server = build_server(service, client_budget_s=budget, default_repo=root)
        try:
            if transport == "stdio":
                run_stdio(server)
            else:
                import uvicorn

                uvicorn.run(http_app(server, settings, host=host), host=host, port=port)
        finally:
            service.close()

    @app.command()
    def audit(
        verification_id: Annotated[
            str | None, typer.Argument(help="A verification id (default: list transcripts).")
        ] = None,
        validate: Annotated[
            bool, typer.Option("--validate", help="Check every file against integrity.json.")
        ] = False,
        limit: Annotated[int, typer.Option(min=1, help="Transcripts to list.")] = 20,
        output_format: Annotated[str, typer.Option("--output-format", help="text | json")] = (
            "text"
        ),
        repo: RepoOpt = Path("."),
    ) -> None:
        """List transcripts, or show one; --validate exits 1 if any was altered."""
        from rich.console import Console
        from rich.table import Table

        from api.db.repository import ingest_transcripts
        from api.service import audit_list, audit_one, find_transcript_folder

        if output_format not in ("text", "json"):
            raise _fail(f"--output-format must be text or json, not {output_format!r}")
        settings = _settings(repo)
        bases = _bases(settings, repo)
        store = None
        try:
            store = _store(settings, repo)
            ingest_transcripts(store, bases)
        except typer.Exit:
            typer.echo("llm-council: continuing without the database", err=True)
        out = Console(soft_wrap=True)
        if verification_id:
            folder = find_transcript_folder(verification_id, bases, store)
            if folder is None:
                raise _fail(
                    f"no transcript for verification {verification_id!r} under "
                    f"{', '.join(str(b) for b in bases)}"
                )
            info = audit_one(folder, verification_id, validate=validate)
            bad = validate and not info["integrity"]["ok"]
            if output_format == "json":
                sys.stdout.write(json.dumps(info, indent=2) + "\n")
            else:
                result = info.get("result") or {}
                out.print(f"verification {verification_id}", highlight=False)
                out.print(f"  location: {info['location']}", highlight=False, markup=False)
                out.print(
                    f"  verdict:  {result.get('verdict')} (exit {result.get('exit_code')}), "
                    f"tier {result.get('tier')}",
                    highlight=False,
                )
                out.print(f"  files:    {', '.join(info['files'])}", highlight=False)
                if validate:
                    if bad:
                        out.print("  integrity: FAILED", highlight=False)
                        for problem in info["integrity"]["problems"]:
                            out.print(f"    - {problem}", highlight=False, markup=False)
                    else:
                        out.print("  integrity: ok", highlight=False)
            raise typer.Exit(1 if bad else 0)
        items = audit_list(bases, validate=validate, limit=limit, store=store)
        bad = validate and any(not i.get("integrity_ok", True) for i in items)
        if output_format == "json":
            sys.stdout.write(json.dumps({"transcripts": items}, indent=2) + "\n")
            raise typer.Exit(1 if bad else 0)
        if not items:
            out.print(f"no transcripts under {', '.join(str(b) for b in bases)}", markup=False)
            raise typer.Exit(0)
        table = Table(title="transcripts", show_lines=False)
        for col in ("verification", "verdict", "tier", "folder"):
            table.add_column(col)
        if validate:
            table.add_column("integrity")
        for item in items:
            row = [
                item["verification_id"],
                str(item.get("verdict") or ("unfinished" if not item["finished"] else "?")),
                str(item.get("tier") or ""),
                Path(item["location"]).name,
            ]
            if validate:
                row.append("ok" if item["integrity_ok"] else "; ".join(item["problems"]))
            table.add_row(*row)
        out.print(table)
        raise typer.Exit(1 if bad else 0)

    @app.command()
    def history(
        limit: Annotated[int, typer.Option(min=1, max=500, help="Rows to show.")] = 20,
        verdict: Annotated[str | None, typer.Option(help="pass | fail | unclear")] = None,
        tier: Annotated[str | None, typer.Option(help="quick | balanced | high | reasoning")] = (
            None
        ),
        output_format: Annotated[str, typer.Option("--output-format", help="text | json")] = (
            "text"
        ),
        repo: RepoOpt = Path("."),
    ) -> None:
        """Recent verifications (API, MCP and gate runs) from the database."""
        from rich.console import Console
        from rich.table import Table

        from api.db.repository import VerificationFilter, as_utc, ingest_transcripts
        from shared.tiers import parse_tier

        if output_format not in ("text", "json"):
            raise _fail(f"--output-format must be text or json, not {output_format!r}")
        if verdict is not None and verdict not in ("pass", "fail", "unclear"):
            raise _fail(f"--verdict must be pass, fail or unclear, not {verdict!r}")
        try:
            tier_value = parse_tier(tier).value if tier else None
        except ValueError as exc:
            raise _fail(str(exc)) from None
        settings = _settings(repo)
        store = _store(settings, repo)
        report = ingest_transcripts(store, _bases(settings, repo))
        for folder, why in report.skipped:
            typer.echo(f"llm-council: not indexed: {folder}: {why}", err=True)
        rows, total = store.search(
            VerificationFilter(verdict=verdict, tier=tier_value), limit=limit
        )
        if output_format == "json":
            items = [
                {
                    "verification_id": r.id,
                    "created_at": as_utc(r.created_at).isoformat(),  # type: ignore[union-attr]
                    "state": r.state,
                    "verdict": r.verdict,
                    "exit_code": r.exit_code,
                    "tier": r.tier,
                    "snapshot": r.snapshot_resolved or r.snapshot_requested,
                    "source": r.source,
                    "runner": r.runner,
                    "transcript_location": r.transcript_location,
                }
                for r in rows
            ]
            sys.stdout.write(json.dumps({"total": total, "items": items}, indent=2) + "\n")
            return
        out = Console(soft_wrap=True)
        if not rows:
            out.print("no verifications recorded yet")
            return
        table = Table(title=f"recent verifications ({len(rows)} of {total})")
        for col in ("created (UTC)", "id", "verdict", "exit", "tier", "snapshot", "source"):
            table.add_column(col)
        for r in rows:
            created = as_utc(r.created_at)
            verdict_text = r.verdict or r.state
            if r.unclear_reason:
                verdict_text += f" ({r.unclear_reason})"
            table.add_row(
                created.strftime("%Y-%m-%d %H:%M:%S") if created else "",
                r.id[:12],
                verdict_text,
                "" if r.exit_code is None else str(r.exit_code),
                r.tier,
                (r.snapshot_resolved or r.snapshot_requested)[:12],
                r.source,
            )
        out.print(table)
