"""The verdict engine: the only place a verdict is formed.

`decide` is a pure function of the facts a run gathered (`DecisionInputs`), the chairman's
findings and the coverage receipt. Every surface renders its `Decision`; none recompute it.
The response model calls `decide` again on construction and rejects any mismatch, so a
payload whose verdict, exit code or blocking issues were edited fails closed.

This module imports nothing but pydantic, the standard library and `shared` models.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from shared.models import (
    CoverageReceipt,
    Finding,
    Frozen,
    OmittedPath,
    RetryHint,
    Severity,
    UnclearReason,
    Verdict,
)
from shared.tiers import Tier, next_tier

ChairmanOutcome = Literal["ok", "failed", "timed_out", "disabled", "not_run"]
InputError = Literal["input_too_large", "no_reviewable_content"]

DEFAULT_ACK_REASONS: tuple[str, ...] = (
    "binary",
    "generated",
    "vendored",
    "too_large",
    "ignored",
    "noise",
)

#: Exit codes are a lookup, never a second opinion.
EXIT_CODES: dict[Verdict, int] = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.UNCLEAR: 2}
EXIT_NOTHING_REVIEWED = 3


class DecisionInputs(Frozen):
    """What a run measured, in the terms the engine needs."""

    tier: Tier = Tier.BALANCED
    structured: bool = True
    findings_source: Literal["structured", "fallback", "skipped"] = "structured"
    chairman_outcome: ChairmanOutcome = "ok"
    chairman_verdict: Literal["pass", "fail"] | None = None
    verdict_parse: Literal["ok", "error", "absent"] = "absent"
    confidence: float | None = None
    confidence_threshold: float = 0.7
    stage1_ok: int = 0
    stage2_ok: int = 0
    min_stage1_reviewers: int = 2
    deadline_fired: bool = False
    stage2_completed: bool = False
    input_error: InputError | None = None
    coverage_ack_reasons: tuple[str, ...] = DEFAULT_ACK_REASONS


class Decision(Frozen):
    verdict: Verdict
    unclear_reason: UnclearReason | None = None
    exit_code: int
    ci_should_fail: bool
    blocking_issues: tuple[Finding, ...] = ()
    inner_verdict: Literal["pass", "fail"] | None = None
    pass_blocked_by: Literal["deliberation_invalid", "chairman_contradicts_findings"] | None = None
    verdict_source: Literal["mechanical", "legacy", "chairman_disabled", "none"] = "none"
    retry_hint: RetryHint | None = None
    clamped: tuple[OmittedPath, ...] | None = None
    error: InputError | None = None


def blocking_subset(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """The critical findings; unknown or blank severities count as critical."""
    return tuple(f for f in findings if f.effective_severity is Severity.CRITICAL)


def exit_code_for(verdict: Verdict, error: InputError | None) -> int:
    if error == "no_reviewable_content":
        return EXIT_NOTHING_REVIEWED
    return EXIT_CODES[verdict]


def retry_hint_for(tier: Tier, *, synthesis_starved: bool) -> RetryHint:
    """Advice for a run that ran out of time: retry up, never down."""
    reason: Literal["synthesis_starved", "deadline_exhausted"] = (
        "synthesis_starved" if synthesis_starved else "deadline_exhausted"
    )
    up = next_tier(tier)
    if up is None:
        return RetryHint(
            action="reduce_scope",
            suggested_tier=None,
            reason=reason,
            message=(
                f"No tier is above {tier.value}: narrow --file-paths to the files that "
                "matter and retry."
            ),
        )
    return RetryHint(
        action="escalate_tier",
        suggested_tier=up,
        reason=reason,
        message=(
            f"Retry at tier={up.value}: the {tier.value} deadline ran out "
            + (
                "while the chairman was synthesising."
                if synthesis_starved
                else "before peer review finished."
            )
        ),
    )


def unacknowledged(
    omitted: Iterable[OmittedPath], ack_reasons: Iterable[str]
) -> tuple[OmittedPath, ...]:
    """Omissions of changed or named files whose reason was not acknowledged."""
    acked = set(ack_reasons)
    return tuple(o for o in omitted if o.changed and o.reason not in acked)


def clamp_triggers(
    coverage: CoverageReceipt | None, ack_reasons: Iterable[str]
) -> tuple[OmittedPath, ...]:
    """What the clamp policy turns a pass into `incomplete_coverage` for."""
    if coverage is None or coverage.policy != "clamp":
        return ()
    return unacknowledged(coverage.omitted, ack_reasons)


def _unclear(
    inputs: DecisionInputs,
    findings: tuple[Finding, ...],
    reason: UnclearReason | None,
    **extra: object,
) -> Decision:
    error = extra.pop("error", None)
    return Decision(
        verdict=Verdict.UNCLEAR,
        unclear_reason=reason,
        exit_code=exit_code_for(Verdict.UNCLEAR, error),  # type: ignore[arg-type]
        ci_should_fail=True,
        blocking_issues=blocking_subset(findings),
        error=error,
        **extra,
    )


def decide(
    inputs: DecisionInputs,
    findings: tuple[Finding, ...] = (),
    coverage: CoverageReceipt | None = None,
) -> Decision:
    """Turn a run's facts into exactly one verdict. Pure and total."""
    if inputs.input_error is not None:
        return _unclear(inputs, findings, None, error=inputs.input_error)
    if inputs.chairman_outcome == "disabled":
        return _unclear(
            inputs, findings, UnclearReason.CHAIRMAN_DISABLED, verdict_source="chairman_disabled"
        )
    if inputs.deadline_fired:
        hint = retry_hint_for(inputs.tier, synthesis_starved=inputs.stage2_completed)
        return _unclear(inputs, findings, UnclearReason.TIMEOUT, retry_hint=hint)
    if inputs.chairman_outcome == "timed_out":
        hint = retry_hint_for(inputs.tier, synthesis_starved=True)
        return _unclear(inputs, findings, UnclearReason.INFRA_FAILURE, retry_hint=hint)
    if inputs.chairman_outcome in ("failed", "not_run"):
        return _unclear(inputs, findings, UnclearReason.INFRA_FAILURE)

    mechanical = inputs.structured and inputs.findings_source == "structured"
    source: Literal["mechanical", "legacy"] = "mechanical" if mechanical else "legacy"
    if mechanical:
        inner: Literal["pass", "fail"] | None = "fail" if blocking_subset(findings) else "pass"
    else:
        inner = inputs.chairman_verdict if inputs.verdict_parse == "ok" else None

    if inner == "fail":
        return Decision(
            verdict=Verdict.FAIL,
            exit_code=exit_code_for(Verdict.FAIL, None),
            ci_should_fail=True,
            blocking_issues=blocking_subset(findings),
            inner_verdict="fail",
            verdict_source=source,
        )

    common = {"inner_verdict": inner, "verdict_source": source}
    # Peer review is required whenever there were peers to review (two or more answers).
    peer_review_ok = inputs.stage1_ok < 2 or inputs.stage2_ok >= 1
    deliberation_valid = (
        inputs.stage1_ok >= inputs.min_stage1_reviewers
        and peer_review_ok
        and inputs.verdict_parse == "ok"
    )
    if inner is None or not deliberation_valid:
        return _unclear(
            inputs,
            findings,
            UnclearReason.INFRA_FAILURE,
            pass_blocked_by="deliberation_invalid",
            **common,
        )
    if mechanical and inputs.chairman_verdict == "fail":
        return _unclear(
            inputs,
            findings,
            UnclearReason.LOW_CONFIDENCE,
            pass_blocked_by="chairman_contradicts_findings",
            **common,
        )
    if inputs.confidence is None or inputs.confidence < inputs.confidence_threshold:
        return _unclear(inputs, findings, UnclearReason.LOW_CONFIDENCE, **common)
    triggers = clamp_triggers(coverage, inputs.coverage_ack_reasons)
    if triggers:
        return _unclear(
            inputs, findings, UnclearReason.INCOMPLETE_COVERAGE, clamped=triggers, **common
        )
    return Decision(
        verdict=Verdict.PASS,
        exit_code=exit_code_for(Verdict.PASS, None),
        ci_should_fail=False,
        blocking_issues=blocking_subset(findings),
        **common,
    )
