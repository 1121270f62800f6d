"""The council pipeline's steps, shared by the embedded and the Celery runner.

A runner plans a run (`plan_run`), runs stage 1 per model, stage 2 per reviewer and the
chairman with the functions in `shared.stages`, and closes it with `finalize`, which asks
the verdict engine for the one verdict and writes the transcript.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from shared import transcript
from shared.budget import MIN_CALL_S, Budget
from shared.models import (
    Aggregate,
    ChairmanReport,
    CoverageReceipt,
    Frozen,
    PeerReview,
    ProviderFailure,
    RubricScores,
    Stage,
    Stage1Answer,
    VerifyDiagnostics,
)
from shared.prompts import render_subject, stable_prefix
from shared.providers.base import ProviderClient
from shared.request import VerifyRequest
from shared.response import SnapshotInfo, VerifyResponse
from shared.selection import input_too_large_message
from shared.settings import NO_FALLBACK, CouncilSettings
from shared.stages import (
    assign_labels,
    combined_confidence,
    findings_by_severity,
    peer_answers,
    run_chairman,
    top_ranked_answer,
)
from shared.subject import Subject
from shared.tiers import TIER_SPECS, Tier, verify_deadline_s
from shared.verdict import DecisionInputs, decide

#: A call that ends this close to the verify deadline counts as the deadline firing.
DEADLINE_SLACK_S = 0.25


class RunPlan(Frozen):
    """Everything a run needs, fixed when the verification is created (JSON-serialisable)."""

    verification_id: str
    created_at: float
    tier: Tier
    deadline_at: float
    stage1_end: float
    stage2_end: float
    per_call_cap_s: float
    models: tuple[str, ...]
    chairman: str
    fallback_chairman: str | None = None
    chairman_disabled: bool = False
    seed: int
    prefix: str
    rubric_focus: tuple[str, ...] = ()
    structured: bool = True
    confidence_threshold: float
    min_stage1_reviewers: int
    ack_reasons: tuple[str, ...]
    snapshot: SnapshotInfo
    coverage: CoverageReceipt
    expanded_paths: tuple[str, ...] | None = None
    paths_truncated: bool = False
    expansion_warnings: tuple[str, ...] = ()
    content_chars: int = 0
    input_error: Literal["input_too_large", "no_reviewable_content"] | None = None
    error_message: str | None = None
    offline: bool = False
    transcript_path: str

    @property
    def budget(self) -> Budget:
        return Budget(
            created_at=self.created_at,
            deadline_at=self.deadline_at,
            stage1_end=self.stage1_end,
            stage2_end=self.stage2_end,
            per_call_cap_s=self.per_call_cap_s,
        )

    @property
    def folder(self) -> Path:
        return Path(self.transcript_path)


def new_verification_id() -> str:
    return uuid.uuid4().hex


def input_error_for(subject: Subject, tier: Tier) -> tuple[str | None, str | None]:
    if not subject.files:
        return "no_reviewable_content", "no reviewable file resolved from the snapshot"
    message = input_too_large_message(subject, TIER_SPECS[tier].max_input_chars)
    if message:
        return "input_too_large", message
    return None, None


def transcript_base(settings: CouncilSettings, repo: Path | None) -> Path:
    base = settings.transcript_dir
    if not base.is_absolute():
        base = (repo or Path.cwd()) / base
    return base


def ensure_state_ignored(settings: CouncilSettings, repo: Path | None) -> None:
    """Keep the state folder (transcripts, logs) out of the repository's commits."""
    state = (
        settings.state_dir
        if settings.state_dir.is_absolute()
        else ((repo or Path.cwd()) / settings.state_dir)
    )
    marker = state / ".gitignore"
    if not marker.exists():
        try:
            state.mkdir(parents=True, exist_ok=True)
            marker.write_text("# llm-council state: transcripts and logs\n*\n")
        except OSError:
            pass


def plan_run(
    request: VerifyRequest,
    settings: CouncilSettings,
    subject: Subject,
    *,
    offline: bool = False,
    verification_id: str | None = None,
    now: float | None = None,
) -> RunPlan:
    """Fix the run's identity, deadline, council and prompt prefix; write request.json."""
    created = time.time() if now is None else now
    vid = verification_id or new_verification_id()
    tier = request.tier
    total = verify_deadline_s(tier, settings.timeout_multiplier)
    budget = Budget.allocate(
        created, total, settings.per_call_cap_s(tier), settings.chairman_reserve_fraction
    )
    error, message = input_error_for(subject, tier)
    repo = Path(subject.repo) if subject.repo else None
    folder = transcript_base(settings, repo) / transcript.transcript_dir_name(vid, created)
    ensure_state_ignored(settings, repo)
    plan = RunPlan(
        verification_id=vid,
        created_at=created,
        tier=tier,
        deadline_at=budget.deadline_at,
        stage1_end=budget.stage1_end,
        stage2_end=budget.stage2_end,
        per_call_cap_s=budget.per_call_cap_s,
        models=settings.council_for(tier),
        chairman=settings.chairman_for(tier),
        fallback_chairman=settings.fallback_chairman,
        chairman_disabled=settings.chairman_disabled,
        seed=request.shuffle_seed if request.shuffle_seed is not None else secrets.randbits(32),
        prefix=stable_prefix(render_subject(subject), request.rubric_focus) if not error else "",
        rubric_focus=request.rubric_focus,
        structured=settings.structured_findings,
        confidence_threshold=(
            request.confidence_threshold
            if request.confidence_threshold is not None
            else settings.confidence_threshold
        ),
        min_stage1_reviewers=settings.min_stage1_reviewers,
        ack_reasons=tuple(settings.coverage_ack_reasons),
        snapshot=SnapshotInfo(
            requested=subject.snapshot_requested,
            resolved=subject.snapshot_resolved,
            repo=subject.repo,
        ),
        coverage=subject.coverage,
        expanded_paths=subject.expanded_paths,
        paths_truncated=subject.paths_truncated,
        expansion_warnings=subject.expansion_warnings,
        content_chars=subject.total_chars,
        input_error=error,
        error_message=message,
        offline=offline,
        transcript_path=str(folder),
    )
    transcript.write_json(
        folder, "request.json", {"request": request, "plan": plan.model_dump(exclude={"prefix"})}
    )
    if plan.prefix:
        transcript.atomic_write(folder / "subject.txt", plan.prefix.encode(), durable=False)
    return plan


# --- between stages --------------------------------------------------------------------------


def labels_for(plan: RunPlan, answers: Mapping[str, Stage1Answer]) -> dict[str, str]:
    """Anonymous labels over the models whose stage-1 answer is usable."""
    ok = [m for m in plan.models if m in answers and answers[m].ok]
    return assign_labels(ok, plan.seed)


def stage2_assignments(
    plan: RunPlan, answers: Mapping[str, Stage1Answer]
) -> dict[str, list[tuple[str, str]]]:
    """reviewer -> the (label, answer) pairs it is shown; reviewers with no peer are skipped."""
    labels = labels_for(plan, answers)
    out = {}
    for reviewer in labels.values():
        shown = peer_answers(labels, answers, exclude=reviewer)
        if shown:
            out[reviewer] = shown
    return out


def synthesise(
    plan: RunPlan,
    client: ProviderClient,
    answers: Mapping[str, Stage1Answer],
    agg: Aggregate,
    *,
    now: float | None = None,
) -> ChairmanReport:
    """The chairman, then the fallback chairman if the first failed with time left."""
    if plan.chairman_disabled:
        top = top_ranked_answer(agg, answers)
        return ChairmanReport(
            model=plan.chairman,
            ok=False,
            findings_source="skipped",
            rationale=(top.summary if top else ""),
        )
    if not any(a.ok for a in answers.values()):
        failures = "; ".join(
            f"{m}: {a.error.kind}{f' {a.error.status}' if a.error.status else ''} "
            f"{a.error.message}".strip()
            for m, a in answers.items()
            if a.error is not None
        )
        return ChairmanReport(
            model=plan.chairman,
            ok=False,
            rationale=f"No council member answered stage 1 ({failures}).",
            error=ProviderFailure(kind="error", message="no council member answered stage 1"),
        )
    labels = dict(agg.labels)
    candidates = [plan.chairman]
    top = top_ranked_answer(agg, answers)
    fallback = plan.fallback_chairman or (top.model if top else None)
    if fallback and fallback not in (plan.chairman, NO_FALLBACK):
        candidates.append(fallback)
    report: ChairmanReport | None = None
    for i, model in enumerate(candidates):
        start = time.time() if now is None or i else now
        timeout = plan.budget.call_timeout(Stage.CHAIRMAN, start)
        if timeout < MIN_CALL_S:
            break
        report = run_chairman(
            client,
            model,
            prefix=plan.prefix,
            labels=labels,
            answers=answers,
            agg=agg,
            verification_id=plan.verification_id,
            timeout_s=timeout,
            deadline_at=plan.deadline_at,
        )
        if report.ok:
            return report.model_copy(update={"used_fallback_chairman": i > 0})
    if report is None:
        return ChairmanReport(
            model=plan.chairman,
            ok=False,
            timed_out=True,
            error=ProviderFailure(kind="timeout", message="no time left for the chairman"),
        )
    return report


def deadline_fired(plan: RunPlan, report: ChairmanReport, now: float | None = None) -> bool:
    """The verify deadline, not the chairman's own call cap, cut the run short."""
    if report.ok or plan.chairman_disabled:
        return False
    t = time.time() if now is None else now
    return report.timed_out and t >= plan.deadline_at - DEADLINE_SLACK_S


def _mean_scores(reviews: Sequence[PeerReview]) -> RubricScores:
    sums: dict[str, list[float]] = {}
    for r in reviews:
        for s in r.scores.values():
            for dim, v in s.model_dump().items():
                if v is not None:
                    sums.setdefault(dim, []).append(v)
    return RubricScores(**{d: round(sum(v) / len(v), 2) for d, v in sums.items()})


def _chairman_outcome(
    plan: RunPlan, report: ChairmanReport
) -> Literal["ok", "failed", "timed_out", "disabled", "not_run"]:
    if plan.chairman_disabled:
        return "disabled"
    if report.ok:
        return "ok"
    return "timed_out" if report.timed_out else "failed"


def finalize(
    plan: RunPlan,
    answers: Mapping[str, Stage1Answer],
    reviews: Sequence[PeerReview],
    agg: Aggregate | None,
    report: ChairmanReport | None,
    *,
    completed_stages: Sequence[str],
    fired: bool,
    timing: Mapping[str, int],
    runner: Literal["embedded", "celery"] = "embedded",
) -> VerifyResponse:
    """Ask the verdict engine for the verdict, build the payload, write and seal the transcript."""
    ok_answers = [a for a in answers.values() if a.ok]
    outcome = "not_run" if report is None else _chairman_outcome(plan, report)
    stage2_done = "stage2" in completed_stages
    inputs = DecisionInputs(
        tier=plan.tier,
        structured=plan.structured,
        findings_source=report.findings_source if report else "structured",
        chairman_outcome=outcome,
        chairman_verdict=report.verdict if report else None,
        verdict_parse=report.verdict_parse if report else "absent",
        confidence=combined_confidence(
            report.confidence if report and report.ok else None, agg.agreement if agg else None
        ),
        confidence_threshold=plan.confidence_threshold,
        stage1_ok=len(ok_answers),
        stage2_ok=sum(1 for r in reviews if r.ok),
        min_stage1_reviewers=plan.min_stage1_reviewers,
        deadline_fired=fired,
        stage2_completed=stage2_done,
        input_error=plan.input_error,
        coverage_ack_reasons=plan.ack_reasons,
    )
    findings = report.findings if report and report.ok else ()
    decision = decide(inputs, findings, plan.coverage)
    coverage = plan.coverage.model_copy(update={"clamped": decision.clamped})
    rubric = report.rubric_scores if report and report.ok else _mean_scores(reviews)
    usage = [a.usage for a in answers.values()] + [r.usage for r in reviews]
    if report:
        usage.append(report.usage)
    failed = {a.model: a.error for a in answers.values() if a.error is not None}
    failed.update({f"{r.reviewer} (stage2)": r.error for r in reviews if r.error is not None})
    diagnostics = VerifyDiagnostics(
        findings_source=report.findings_source if report else "structured",
        fallback_reason=report.fallback_reason if report else None,
        verdict_source=decision.verdict_source,
        verdict_parse=inputs.verdict_parse,
        verdict_parse_error=report.verdict_parse_error if report else None,
        deliberation_agreement=agg.agreement if agg else None,
        pass_blocked_by=decision.pass_blocked_by,
        findings_by_severity=findings_by_severity(findings),
        inner_verdict=decision.inner_verdict,
        inner_confidence=inputs.confidence if decision.inner_verdict else None,
        inner_confidence_calibrated=inputs.confidence if decision.inner_verdict else None,
        failed_models=failed,
        chairman_error=report.error if report else None,
        chairman_model=report.model if report else None,
        used_fallback_chairman=bool(report and report.used_fallback_chairman),
        stage1_answers=len(ok_answers),
        stage2_reviews=sum(1 for r in reviews if r.ok),
        shuffle_seed=plan.seed,
        aggregate_ranking=agg.ranking if agg else (),
    )
    rationale = (report.rationale if report else "") or (plan.error_message or "")
    response = VerifyResponse(
        verification_id=plan.verification_id,
        verdict=decision.verdict,
        exit_code=decision.exit_code,
        ci_should_fail=decision.ci_should_fail,
        confidence=inputs.confidence,
        confidence_calibrated=inputs.confidence,
        retry_hint=decision.retry_hint,
        unclear_reason=decision.unclear_reason,
        rationale=rationale,
        transcript_location=plan.transcript_path,
        error=decision.error,
        error_message=plan.error_message,
        rubric_scores=rubric,
        blocking_issues=decision.blocking_issues,
        findings=findings,
        diagnostics=diagnostics,
        partial=fired or (report is not None and not report.ok and bool(ok_answers)),
        timeout_fired=fired,
        completed_stages=tuple(completed_stages),
        expanded_paths=plan.expanded_paths,
        paths_truncated=plan.paths_truncated,
        expansion_warnings=plan.expansion_warnings,
        coverage=coverage,
        timing=dict(timing),
        input_metrics={
            "content_chars": plan.content_chars,
            "tier_max_chars": TIER_SPECS[plan.tier].max_input_chars,
            "num_models": len(plan.models),
            "num_reviewers": len(reviews),
            "tier": plan.tier.value,
            "prompt_tokens": sum(u.prompt_tokens for u in usage),
            "completion_tokens": sum(u.completion_tokens for u in usage),
            "cached_tokens": sum(u.cached_tokens for u in usage),
            "cache_write_tokens": sum(u.cache_write_tokens for u in usage),
        },
        tier=plan.tier,
        snapshot=plan.snapshot,
        models=plan.models,
        chairman=plan.chairman,
        offline=plan.offline,
        runner=runner,
        decision_inputs=inputs,
    )
    write_outcome(plan.folder, response)
    return response


def write_outcome(folder: Path, response: VerifyResponse) -> None:
    transcript.write_json(folder, transcript.RESULT_FILE, response)
    transcript.seal(folder)
