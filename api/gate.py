"""`llm-council gate`: verify one commit and exit with the verdict's code."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from shared.response import VerifyResponse
from shared.settings import CouncilSettings, SettingsError, load_settings
from shared.tiers import parse_tier

if TYPE_CHECKING:
    from shared.request import VerifyRequest
    from shared.subject import Subject

EXIT_SETUP = 2


class SetupError(Exception):
    """A problem that stops the run before any verdict: exit 2 with one clear line."""


@contextlib.contextmanager
def council_settings(settings: CouncilSettings, offline: bool) -> Iterator[CouncilSettings]:
    if not offline:
        yield settings
        return
    from api.offline import offline_settings
    from ops.fake_provider.server import FakeProvider

    with FakeProvider() as fake:
        yield offline_settings(settings, fake)


def check_credentials(settings: CouncilSettings, tier_models: Sequence[str], chairman: str) -> None:
    from shared.providers.client import ProviderKeys, missing_credentials
    from shared.providers.refs import parse_model_ref

    refs = [parse_model_ref(m) for m in (*tier_models, chairman)]
    missing = missing_credentials(refs, ProviderKeys.from_settings(settings))
    if missing:
        raise SetupError(
            f"no council configured: set {' and '.join(missing)} for the council models "
            f"({', '.join(tier_models)}), or choose models with LLM_COUNCIL_MODELS and "
            "LLM_COUNCIL_CHAIRMAN, or run with --offline"
        )


def run_gate(
    *,
    snapshot: str,
    file_paths: Sequence[str] | None,
    tier: str | None,
    rubric_focus: Sequence[str],
    confidence_threshold: float | None,
    output_format: str,
    repo: Path,
    offline: bool,
) -> int:
    out = Console(soft_wrap=True)
    err = Console(stderr=True, soft_wrap=True)
    try:
        payload = _verify(
            snapshot=snapshot,
            file_paths=file_paths,
            tier=tier,
            rubric_focus=rubric_focus,
            confidence_threshold=confidence_threshold,
            repo=repo,
            offline=offline,
            progress=None if output_format == "json" and not sys.stderr.isatty() else err,
        )
    except SetupError as exc:
        err.print(f"llm-council: {exc}", markup=False, highlight=False)
        return EXIT_SETUP
    if output_format == "json":
        sys.stdout.write(payload.model_dump_json(indent=2) + "\n")
    else:
        from api.render import render_text

        render_text(payload, out)
    return payload.exit_code


def _verify(
    *,
    snapshot: str,
    file_paths: Sequence[str] | None,
    tier: str | None,
    rubric_focus: Sequence[str],
    confidence_threshold: float | None,
    repo: Path,
    offline: bool,
    progress: Console | None,
) -> VerifyResponse:
    from shared.request import VerifyRequest
    from shared.selection import SubjectError, resolve_subject

    repo = repo.resolve()
    try:
        settings = load_settings(repo)
    except SettingsError as exc:
        raise SetupError(str(exc)) from None
    if settings.coverage_policy == "warn" and settings.coverage_policy_explicit:
        raise SetupError(
            "gate refuses LLM_COUNCIL_COVERAGE_POLICY=warn: a gate that ignores coverage can "
            "pass files it never reviewed; use clamp (default) or fail, or call verify instead"
        )
    try:
        chosen_tier = parse_tier(tier) if tier else settings.default_tier
        request = VerifyRequest(
            snapshot_id=snapshot,
            target_paths=tuple(file_paths) if file_paths else None,
            tier=chosen_tier,
            rubric_focus=tuple(p for item in rubric_focus for p in item.split(",") if p.strip()),
            confidence_threshold=confidence_threshold,
            repo=str(repo),
        )
    except ValueError as exc:
        raise SetupError(str(exc).splitlines()[0]) from None

    with council_settings(settings, offline) as eff:
        if not offline:
            check_credentials(eff, eff.council_for(request.tier), eff.chairman_for(request.tier))
        try:
            subject = resolve_subject(repo, request.snapshot_id, request.target_paths, settings=eff)
        except SubjectError as exc:
            raise SetupError(str(exc)) from None
        return _run(request, eff, subject, offline=offline, progress=progress)


def _run(
    request: VerifyRequest,
    settings: CouncilSettings,
    subject: Subject,
    *,
    offline: bool,
    progress: Console | None,
) -> VerifyResponse:
    from shared.pipeline import plan_run

    if settings.broker_url:  # fail before anything is written
        from worker.config import WorkerSettings, group_of
        from worker.runner import check_reachable

        try:
            check_reachable(settings, WorkerSettings(), group_of(request.tier))
        except ConnectionError as exc:
            raise SetupError(str(exc)) from None
    plan = plan_run(request, settings, subject, offline=offline)

    def report(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress.print(f"[dim]{stage}: {done}/{total}[/dim]", highlight=False)

    if settings.broker_url:
        from worker.runner import run_remote

        try:
            return run_remote(plan, settings, on_progress=report)
        except ConnectionError as exc:
            raise SetupError(str(exc)) from None
    from shared.embedded import run_embedded
    from shared.providers.client import HttpProviderClient

    client = HttpProviderClient.from_settings(settings)
    return run_embedded(plan, client, on_progress=report)
