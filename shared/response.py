"""The verify response: a frozen payload that re-derives its own verdict.

Consumers render it; none recompute it. Construction (in code or from JSON) calls the
verdict engine on the payload's own evidence and raises on any mismatch, so a friendlier
verdict, a dropped blocking issue or a flipped exit code cannot be handed on.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from shared.models import (
    CoverageReceipt,
    Finding,
    Frozen,
    RetryHint,
    RubricScores,
    UnclearReason,
    Verdict,
    VerifyDiagnostics,
)
from shared.tiers import Tier
from shared.verdict import DecisionInputs, decide


class TamperedPayloadError(ValueError):
    """A payload's verdict fields disagree with what its evidence decides."""


class SnapshotInfo(Frozen):
    requested: str
    resolved: str
    repo: str | None = None


class VerifyResponse(Frozen):
    """Everything a verification returns (the spec's "Response fields")."""

    schema_version: Literal[1] = 1
    verification_id: str
    verdict: Verdict
    exit_code: int
    ci_should_fail: bool
    confidence: float | None = None
    confidence_calibrated: float | None = None
    retry_hint: RetryHint | None = None
    unclear_reason: UnclearReason | None = None
    rationale: str = ""
    transcript_location: str | None = None
    error: Literal["input_too_large", "no_reviewable_content"] | None = None
    error_message: str | None = None

    rubric_scores: RubricScores = RubricScores()
    blocking_issues: tuple[Finding, ...] = ()
    findings: tuple[Finding, ...] = ()
    diagnostics: VerifyDiagnostics = VerifyDiagnostics()

    partial: bool = False
    timeout_fired: bool = False
    completed_stages: tuple[str, ...] | None = None
    expanded_paths: tuple[str, ...] | None = None
    paths_truncated: bool | None = None
    expansion_warnings: tuple[str, ...] | None = None
    coverage: CoverageReceipt | None = None
    timing: dict[str, int] | None = None
    input_metrics: dict[str, Any] | None = None
    screening: dict[str, Any] | None = None
    evidence_summary: tuple[dict[str, Any], ...] | None = None
    evidence_warnings: tuple[str, ...] | None = None

    tier: Tier = Tier.BALANCED
    snapshot: SnapshotInfo | None = None
    models: tuple[str, ...] = ()
    chairman: str | None = None
    offline: bool = False
    runner: Literal["embedded", "celery"] = "embedded"
    decision_inputs: DecisionInputs = Field(default_factory=DecisionInputs)

    @model_validator(mode="after")
    def _rederive(self) -> VerifyResponse:
        d = decide(self.decision_inputs, self.findings, self.coverage)
        expected: dict[str, object] = {
            "verdict": d.verdict,
            "exit_code": d.exit_code,
            "ci_should_fail": d.ci_should_fail,
            "blocking_issues": d.blocking_issues,
            "unclear_reason": d.unclear_reason,
            "retry_hint": d.retry_hint,
            "error": d.error,
            "timeout_fired": self.decision_inputs.deadline_fired,
        }
        wrong = [name for name, value in expected.items() if getattr(self, name) != value]
        if self.diagnostics.inner_verdict != d.inner_verdict:
            wrong.append("diagnostics.inner_verdict")
        if self.diagnostics.pass_blocked_by != d.pass_blocked_by:
            wrong.append("diagnostics.pass_blocked_by")
        if self.coverage is not None and self.coverage.clamped != d.clamped:
            wrong.append("coverage.clamped")
        if wrong:
            raise TamperedPayloadError(
                "payload does not match its evidence (the verdict engine decides "
                f"{d.verdict.value}, exit {d.exit_code}); mismatched: {', '.join(wrong)}"
            )
        return self

    @property
    def reviewed_paths(self) -> tuple[str, ...]:
        return self.coverage.reviewed if self.coverage else ()
