"""Renderings of a VerifyResponse. They only present the payload; none recompute it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shared.response import VerifyResponse

VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "unclear": "bold yellow"}


def render_text(payload: VerifyResponse, console: Console) -> None:
    reviewed = payload.reviewed_paths
    console.print(f"[bold]Reviewed files ({len(reviewed)}):[/bold]")
    for path in reviewed:
        console.print(f"  {path}")
    if payload.coverage and payload.coverage.omitted:
        console.print(f"[bold]Not reviewed ({len(payload.coverage.omitted)}):[/bold]")
        for o in payload.coverage.omitted:
            console.print(f"  {o.path}  [dim]({o.reason}, {o.origin})[/dim]")
    if payload.snapshot:
        console.print(
            f"Snapshot: {payload.snapshot.requested} -> {payload.snapshot.resolved}  "
            f"tier: {payload.tier.value}"
        )
    who = ", ".join(payload.models)
    if payload.offline:
        names = ", ".join(m.rsplit(":", 1)[-1] for m in payload.models)
        chair = (payload.chairman or "").rsplit(":", 1)[-1]
        console.print(
            f"[magenta]Offline reviewers (bundled fake provider):[/magenta] {names}; "
            f"chairman {chair}"
        )
    else:
        console.print(f"Council: {who}; chairman: {payload.chairman}")

    verdict = Text(payload.verdict.value.upper(), style=VERDICT_STYLE[payload.verdict.value])
    line = Text("Verdict: ") + verdict
    if payload.unclear_reason:
        line += Text(f" ({payload.unclear_reason.value})")
    if payload.error:
        line += Text(f" [error: {payload.error}]")
    console.print(line)
    conf = "n/a" if payload.confidence is None else f"{payload.confidence:.2f}"
    console.print(f"Confidence: {conf}   exit code: {payload.exit_code}")
    if payload.error_message:
        console.print(f"[yellow]{payload.error_message}[/yellow]")
    if payload.diagnostics.pass_blocked_by:
        console.print(f"Pass blocked by: {payload.diagnostics.pass_blocked_by}")
    if payload.coverage and payload.coverage.clamped:
        paths = ", ".join(f"{o.path} ({o.reason})" for o in payload.coverage.clamped)
        console.print(f"[yellow]Coverage clamp: not reviewed: {paths}[/yellow]")
    if payload.retry_hint:
        console.print(f"[yellow]Retry hint: {payload.retry_hint.message}[/yellow]")
    for model, failure in payload.diagnostics.failed_models.items():
        console.print(
            f"[dim]{model} failed: {failure.kind} {failure.status or ''} {failure.message}[/dim]"
        )
    if payload.diagnostics.chairman_error:
        err = payload.diagnostics.chairman_error
        console.print(
            f"[yellow]Chairman failed: {err.kind} {err.status or ''} {err.message}[/yellow]"
        )
    if payload.findings:
        table = Table(title="Findings", show_lines=False)
        for col in ("severity", "location", "description"):
            table.add_column(col)
        for f in payload.findings:
            sev = f.effective_severity.value
            style = "red" if sev == "critical" else "yellow" if sev == "major" else ""
            table.add_row(Text(sev, style=style), f.location or "-", f.description)
        console.print(table)
    else:
        console.print("Findings: none")
    if payload.rationale:
        console.print(f"Rationale: {payload.rationale}")
    console.print(f"Transcript: {payload.transcript_location}")
