"""`llm-council ignore`: inspect and set up what the council may see.

A plain function with Typer-annotated parameters; the CLI registers it as a command:

    app.command("ignore")(ignore)

Exactly one action per call:

- `--print-defaults`  the compiled-in secret boundary, noise rules and ignore-file chain
- `--explain PATH`    whether PATH is reviewed at `--snapshot` (default HEAD) and which rule
                      decided (secret pattern, ignore file and line, attribute, ...)
- `--init`            write a commented `.llmignore` starter at the repository root; never
                      overwrites one, and refuses when another ignore file of the chain is
                      already in use (a new `.llmignore` would silently take precedence)

Exit codes: 0 done, 1 `--init` found an existing ignore file, 2 setup error (one line on
stderr: not a repository, unknown revision, bad path or settings, wrong options).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from shared.selection import (
    IGNORE_FILE_CHAIN,
    STARTER_TEXT,
    SubjectError,
    default_rules_text,
    explain_path,
)
from shared.selection.resolve import open_repo
from shared.settings import CouncilSettings, SettingsError, load_settings


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=code)


def ignore(
    print_defaults: Annotated[
        bool,
        typer.Option(
            "--print-defaults", help="Print the secret boundary and noise rules built in."
        ),
    ] = False,
    explain: Annotated[
        str | None,
        typer.Option(
            "--explain", metavar="PATH", help="Say whether PATH is reviewed, and which rule."
        ),
    ] = None,
    snapshot: Annotated[
        str, typer.Option("--snapshot", help="Commit to explain against.")
    ] = "HEAD",
    repo: Annotated[
        Path, typer.Option("--repo", help="Repository (any directory inside it).")
    ] = Path("."),
    init: Annotated[
        bool,
        typer.Option("--init", help="Write a commented .llmignore starter (never overwrites)."),
    ] = False,
) -> None:
    """Show the secret boundary and noise rules, explain a path, or start a .llmignore."""
    chosen = [
        name
        for name, on in (
            ("--print-defaults", print_defaults),
            ("--explain", explain is not None),
            ("--init", init),
        )
        if on
    ]
    if len(chosen) != 1:
        raise _fail("choose exactly one of --print-defaults, --explain PATH, --init")
    console = Console(soft_wrap=True, highlight=False)

    if print_defaults:
        console.print(default_rules_text(), markup=False, end="")
        return

    try:
        root = open_repo(repo.expanduser())
    except SubjectError as exc:
        raise _fail(str(exc)) from None

    if init:
        _init(root, console)
        return

    assert explain is not None
    try:
        settings = load_settings(root)
    except SettingsError as exc:
        raise _fail(str(exc)) from None
    _explain(root, snapshot, explain, settings, console)


def _init(root: Path, console: Console) -> None:
    for name in IGNORE_FILE_CHAIN:
        existing = root / name
        if existing.exists() or existing.is_symlink():
            if name == IGNORE_FILE_CHAIN[0]:
                raise _fail(f"{existing} already exists; not overwritten", code=1)
            raise _fail(
                f"{existing} is already in use; a new {IGNORE_FILE_CHAIN[0]} would take "
                f"precedence over it, so none was written (rename {name} to "
                f"{IGNORE_FILE_CHAIN[0]} to switch)",
                code=1,
            )
    target = root / IGNORE_FILE_CHAIN[0]
    try:
        with open(target, "x", encoding="utf-8") as fh:
            fh.write(STARTER_TEXT)
    except FileExistsError:
        raise _fail(f"{target} already exists; not overwritten", code=1) from None
    except OSError as exc:
        raise _fail(f"could not write {target}: {exc.strerror}") from None
    console.print(f"wrote {escape(str(target))}; it takes effect once committed")


def _explain(
    root: Path, snapshot: str, path: str, settings: CouncilSettings, console: Console
) -> None:
    try:
        result = explain_path(root, snapshot, path, settings=settings)
    except SubjectError as exc:
        raise _fail(str(exc)) from None
    ignore_file = result.ignore_file or "none"
    console.print(
        f"snapshot {escape(result.snapshot_requested)} -> {result.snapshot_resolved}; "
        f"file selection {result.selection}; ignore file {escape(ignore_file)}"
    )
    for entry in result.entries:
        where = f" [dim]({escape(entry.source)})[/dim]" if entry.source else ""
        if entry.reviewed:
            status = "[green]reviewed[/green]"
        else:
            status = f"[red]not reviewed[/red] ({escape(entry.reason or '')})"
        console.print(f"{escape(entry.path)}: {status}: {escape(entry.rule)}{where}")
        if entry.note:
            console.print(f"  note: {escape(entry.note)}")
    if result.truncated:
        console.print(
            f"(listing capped at max_files_expansion={settings.max_files_expansion} files)"
        )
