"""The MCP server (official `mcp` SDK, `MCPServer`): `verify`, `verify_status`, `audit`.

`llm-council mcp` serves it over stdio (what Claude Code and Cursor launch) or, with
`--transport http`, over streamable HTTP at `/mcp`. The tools share the HTTP API's service,
so a run started here is recorded in the same database and shows in `history`.

Client timeouts: a verification may legitimately take its tier's whole verify deadline
(twice the tier budget). `verify` blocks only when that deadline fits within the client
budget (`--client-budget` / `LLM_COUNCIL_MCP_CLIENT_BUDGET`, default 90 s); otherwise it
returns at once with a `verification_id` to poll with `verify_status`, so a 20-minute
reasoning review never has its transport killed by the client.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from api.service import (
    ServiceError,
    VerificationService,
    VerifySpec,
)
from shared.response import VerifyResponse
from shared.settings import CouncilSettings
from shared.tiers import Tier, parse_tier, verify_deadline_s

DEFAULT_CLIENT_BUDGET_S = 90.0
CLIENT_BUDGET_ENV = "LLM_COUNCIL_MCP_CLIENT_BUDGET"
#: Suggested polling interval returned with a handle.
POLL_INTERVAL_S = 5.0


def deadlines(settings: CouncilSettings) -> dict[str, float]:
    return {t.value: verify_deadline_s(t, settings.timeout_multiplier) for t in Tier}


def _deadline_text(settings: CouncilSettings, budget_s: float) -> str:
    parts = []
    for tier, secs in deadlines(settings).items():
        mode = "blocks" if secs <= budget_s else "returns a handle"
        parts.append(f"{tier} {secs:g} s ({mode}; MCP_TIMEOUT >= {int((secs + 60) * 1000)})")
    return "; ".join(parts)


def client_budget_from_env(default: float = DEFAULT_CLIENT_BUDGET_S) -> float:
    raw = os.environ.get(CLIENT_BUDGET_ENV)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{CLIENT_BUDGET_ENV} must be a number of seconds, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{CLIENT_BUDGET_ENV} must be positive")
    return value


def build_server(
    service: VerificationService,
    *,
    client_budget_s: float = DEFAULT_CLIENT_BUDGET_S,
    default_repo: Path | None = None,
) -> MCPServer:
    settings = service.settings
    table = _deadline_text(settings, client_budget_s)
    server: MCPServer = MCPServer(
        "llm-council",
        log_level="WARNING",
        instructions=(
            "Verify a commit with a council of LLMs. Call verify; if it returns a "
            "verification_id without a verdict, poll verify_status until state is done. "
            f"Verify deadlines per tier: {table}."
        ),
    )

    def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ServiceError as exc:
            where = f" ({exc.field})" if exc.field else ""
            raise ToolError(f"{exc.message}{where}") from None

    @server.tool(
        description=(
            "Verify a commit of a repository on this machine with the LLM council and return "
            "the verdict payload (verdict pass|fail|unclear, exit_code, blocking_issues, "
            "findings, coverage, transcript_location). Arguments: snapshot_id (commit, "
            "default HEAD), target_paths (files/directories; default: what the commit "
            "changed), tier (quick|balanced|high|reasoning), rubric_focus, "
            "confidence_threshold, repo_root (the repository; must lie under "
            "LLM_COUNCIL_REPO_ROOTS; default: the server's working directory). "
            "A verify runs up to its tier's verify deadline (twice the tier budget): "
            f"{table}. This server blocks only when the deadline fits its client budget of "
            f"{client_budget_s:g} s; otherwise (or with wait=false) it returns at once with "
            "a verification_id: poll verify_status. wait=true forces blocking."
        )
    )
    def verify(
        snapshot_id: str = "HEAD",
        target_paths: list[str] | None = None,
        tier: str | None = None,
        rubric_focus: list[str] | None = None,
        confidence_threshold: float | None = None,
        repo_root: str | None = None,
        wait: bool | None = None,
    ) -> dict[str, Any]:
        try:
            chosen = parse_tier(tier) if tier else settings.default_tier
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        if confidence_threshold is not None and not 0.0 <= confidence_threshold <= 1.0:
            raise ToolError("confidence_threshold must be between 0 and 1")
        repo = repo_root or (str(default_repo) if default_repo else None)
        if repo is None:
            raise ToolError("repo_root is required: this server has no default repository")
        spec = VerifySpec(
            snapshot_id=snapshot_id,
            target_paths=tuple(target_paths) if target_paths else None,
            tier=chosen,
            rubric_focus=tuple(p.strip() for p in rubric_focus or () if p.strip()),
            confidence_threshold=confidence_threshold,
            repo=repo,
        )
        deadline = verify_deadline_s(chosen, settings.timeout_multiplier)
        block = wait if wait is not None else deadline <= client_budget_s
        result = run(service.verify, spec, source="mcp", wait=block)
        if isinstance(result, VerifyResponse):
            return result.model_dump(mode="json")
        handle = result.model_dump(mode="json")
        handle["next"] = (
            f"call verify_status(verification_id={result.verification_id!r}) every "
            f"{POLL_INTERVAL_S:g} s until state is 'done' (at the latest by deadline_at)"
        )
        handle["poll_interval_s"] = POLL_INTERVAL_S
        return handle

    @server.tool(
        description=(
            "State of a verification by id: queued | stage1 | stage2 | chairman | done | "
            "error, with per-stage progress, and the full verdict payload once done. "
            "Returns at once."
        )
    )
    def verify_status(verification_id: str) -> dict[str, Any]:
        status = run(service.status, verification_id)
        out: dict[str, Any] = status.model_dump(mode="json")
        return out

    @server.tool(
        description=(
            "Audit transcripts (.council/logs/<time>-<id>/). Without verification_id: the "
            "most recent transcripts with their verdicts. With one: its result payload and "
            "file list. validate_integrity=true re-hashes every file against integrity.json "
            "and reports any file added, missing or altered. Returns at once."
        )
    )
    def audit(
        verification_id: str | None = None, validate_integrity: bool = False
    ) -> dict[str, Any]:
        return run(service.audit, verification_id or None, validate=validate_integrity)

    return server


def run_stdio(server: MCPServer) -> None:
    server.run("stdio")


def http_app(server: MCPServer, settings: CouncilSettings, *, host: str) -> Any:
    """The streamable-HTTP ASGI app (`/mcp`), behind the bearer token when one is set."""
    app = server.streamable_http_app(host=host)
    if settings.api_token:
        from api.app import BearerAuthMiddleware

        return BearerAuthMiddleware(
            app, settings.api_token.get_secret_value(), open_paths=frozenset()
        )
    return app
