"""Domain models shared by every surface and both runners.

Models are frozen and use tuples for sequences so a payload cannot be edited in place.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.tiers import Tier

RUBRIC_DIMENSIONS = ("accuracy", "relevance", "completeness", "conciseness", "clarity")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Severity(StrEnum):
    CRITICAL = "critical"
    MAJOR = "major"
    MINOR = "minor"
    INFO = "info"


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNCLEAR = "unclear"


class UnclearReason(StrEnum):
    INFRA_FAILURE = "infra_failure"
    LOW_CONFIDENCE = "low_confidence"
    TIMEOUT = "timeout"
    CHAIRMAN_DISABLED = "chairman_disabled"
    INCOMPLETE_COVERAGE = "incomplete_coverage"


class Stage(StrEnum):
    STAGE1 = "stage1"
    STAGE2 = "stage2"
    CHAIRMAN = "chairman"


class Finding(Frozen):
    """One issue raised by the council.

    `severity` keeps what the model wrote (lower-cased); the verdict engine treats anything
    that is not a known severity, including blank, as critical.
    """

    severity: str
    description: str
    location: str | None = None
    dimension: str | None = None

    @field_validator("severity", mode="before")
    @classmethod
    def _normalise_severity(cls, v: Any) -> str:
        return "" if v is None else str(v).strip().lower()

    @property
    def effective_severity(self) -> Severity:
        try:
            return Severity(self.severity)
        except ValueError:
            return Severity.CRITICAL


class RubricScores(Frozen):
    accuracy: float | None = Field(default=None, ge=0, le=10)
    relevance: float | None = Field(default=None, ge=0, le=10)
    completeness: float | None = Field(default=None, ge=0, le=10)
    conciseness: float | None = Field(default=None, ge=0, le=10)
    clarity: float | None = Field(default=None, ge=0, le=10)


class Usage(Frozen):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class ProviderFailure(Frozen):
    """An error marker for a failed model call; stage tasks return it instead of raising."""

    kind: str  # billing | auth | rate_limit | timeout | server | connection | bad_request |
    # not_found | malformed | truncated | error
    status: int | None = None
    type: str | None = None
    message: str = ""
    attempts: int = 1

    @property
    def is_timeout(self) -> bool:
        return self.kind == "timeout"


class Stage1Answer(Frozen):
    model: str
    ok: bool
    verdict: Literal["pass", "fail"] | None = None
    confidence: float | None = None
    summary: str = ""
    findings: tuple[Finding, ...] = ()
    error: ProviderFailure | None = None
    usage: Usage = Usage()
    latency_ms: int = 0


class PeerReview(Frozen):
    reviewer: str
    ok: bool
    ranking: tuple[str, ...] = ()  # anonymous labels, best first ("A", "B", ...)
    scores: dict[str, RubricScores] = Field(default_factory=dict)  # label -> scores
    findings: tuple[Finding, ...] = ()
    error: ProviderFailure | None = None
    usage: Usage = Usage()
    latency_ms: int = 0


class Aggregate(Frozen):
    """Stage-2 result: Borda points per model (self-votes excluded) and reviewer agreement."""

    seed: int
    labels: dict[str, str]  # label -> model
    borda: dict[str, float]
    ranking: tuple[str, ...]  # models, best first
    agreement: float | None = None


class ChairmanReport(Frozen):
    model: str
    ok: bool
    verdict: Literal["pass", "fail"] | None = None
    verdict_parse: Literal["ok", "error", "absent"] = "absent"
    verdict_parse_error: str | None = None
    confidence: float | None = None
    rationale: str = ""
    findings: tuple[Finding, ...] = ()
    findings_source: Literal["structured", "fallback", "skipped"] = "structured"
    fallback_reason: str | None = None
    rubric_scores: RubricScores = RubricScores()
    error: ProviderFailure | None = None
    timed_out: bool = False
    used_fallback_chairman: bool = False
    usage: Usage = Usage()
    latency_ms: int = 0


class OmittedPath(Frozen):
    path: str
    reason: str  # denied_secret | garbage | non-text | binary | generated | vendored | noise |
    # ignored | too_large | not_found | truncated
    origin: Literal["explicit", "discovered"]
    changed: bool = True  # part of the changed set (or explicitly named): the clamp considers it


class CoverageReceipt(Frozen):
    requested: tuple[str, ...] | None = None
    reviewed: tuple[str, ...] = ()
    omitted: tuple[OmittedPath, ...] = ()
    explicit_omitted: bool = False
    truncated: bool = False
    conservation_ok: bool = True
    policy: Literal["clamp", "warn", "fail"] | None = None
    clamped: tuple[OmittedPath, ...] | None = None


class RetryHint(Frozen):
    action: Literal["escalate_tier", "reduce_scope"]
    suggested_tier: Tier | None
    reason: Literal["synthesis_starved", "deadline_exhausted"]
    message: str


class VerifyDiagnostics(Frozen):
    """Telemetry only: nothing gates on these fields."""

    findings_source: Literal["structured", "fallback", "skipped"] = "structured"
    fallback_reason: str | None = None
    verdict_source: Literal["mechanical", "legacy", "chairman_disabled", "none"] = "mechanical"
    verdict_parse: Literal["ok", "error", "absent"] = "absent"
    verdict_parse_error: str | None = None
    deliberation_agreement: float | None = None
    pass_blocked_by: Literal["deliberation_invalid", "chairman_contradicts_findings"] | None = None
    findings_by_severity: dict[str, int] = Field(default_factory=dict)
    verdict_evidence_mismatch: str | None = None
    inner_verdict: Literal["pass", "fail"] | None = None
    inner_confidence: float | None = None
    inner_confidence_calibrated: float | None = None
    failed_models: dict[str, ProviderFailure] = Field(default_factory=dict)
    chairman_error: ProviderFailure | None = None
    chairman_model: str | None = None
    used_fallback_chairman: bool = False
    stage1_answers: int = 0
    stage2_reviews: int = 0
    shuffle_seed: int | None = None
    aggregate_ranking: tuple[str, ...] = ()
