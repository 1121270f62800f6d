"""The `llm-council` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="llm-council",
    help="Verify code changes with a council of LLMs and gate CI on one honest verdict.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def gate(
    snapshot: Annotated[str, typer.Option(help="Commit to verify (any git rev).")] = "HEAD",
    file_paths: Annotated[
        list[str] | None,
        typer.Option("--file-paths", help="File or directory to review (repeatable)."),
    ] = None,
    tier: Annotated[str | None, typer.Option(help="quick | balanced | high | reasoning.")] = None,
    rubric_focus: Annotated[
        list[str] | None, typer.Option("--rubric-focus", help="Focus area, e.g. Security.")
    ] = None,
    confidence_threshold: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="Pass needs at least this confidence.")
    ] = None,
    output_format: Annotated[str, typer.Option("--output-format", help="text | json")] = "text",
    repo: Annotated[Path, typer.Option(help="Repository to verify.")] = Path("."),
    offline: Annotated[
        bool, typer.Option("--offline", help="Use the bundled fake provider: no keys, no network.")
    ] = False,
) -> None:
    """Verify a commit; exit 0 PASS, 1 FAIL, 2 UNCLEAR or setup error, 3 nothing reviewed."""
    from api.gate import run_gate

    if output_format not in ("text", "json"):
        typer.echo(
            f"llm-council: --output-format must be text or json, not {output_format!r}", err=True
        )
        raise typer.Exit(2)
    code = run_gate(
        snapshot=snapshot,
        file_paths=file_paths,
        tier=tier,
        rubric_focus=rubric_focus or [],
        confidence_threshold=confidence_threshold,
        output_format=output_format,
        repo=repo,
        offline=offline,
    )
    raise typer.Exit(code)


def _register_commands() -> None:
    from api import cli_service, cli_worker

    cli_worker.register(app)
    cli_service.register(app)
    try:
        from api.cli_ignore import ignore
    except ImportError:  # pragma: no cover - present in every install
        return
    app.command("ignore")(ignore)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
