"""The verdict engine: the full matrix of inputs to outcomes, and tamper rejection."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from shared.models import CoverageReceipt, Finding, OmittedPath, Verdict, VerifyDiagnostics
from shared.response import VerifyResponse
from shared.tiers import Tier
from shared.verdict import DecisionInputs, blocking_subset, decide, retry_hint_for

CRIT = Finding(severity="critical", description="SQL injection", location="app.py:3")
MAJOR = Finding(severity="major", description="bare except", location="app.py:9")
BLANK = Finding(severity="", description="no severity given")
ODD = Finding(severity="catastrophic", description="unknown severity")

OK = DecisionInputs(
    chairman_outcome="ok",
    chairman_verdict="pass",
    verdict_parse="ok",
    confidence=0.9,
    stage1_ok=4,
    stage2_ok=4,
)


def test_clean_council_passes():
    d = decide(OK, (MAJOR,))
    assert (d.verdict, d.exit_code, d.ci_should_fail) == (Verdict.PASS, 0, False)
    assert d.blocking_issues == ()
    assert d.verdict_source == "mechanical"


@pytest.mark.parametrize("finding", [CRIT, BLANK, ODD])
def test_any_critical_or_unknown_severity_fails(finding):
    d = decide(OK.model_copy(update={"chairman_verdict": "fail"}), (MAJOR, finding))
    assert (d.verdict, d.exit_code, d.ci_should_fail) == (Verdict.FAIL, 1, True)
    assert d.blocking_issues == (finding,)


def test_fail_stands_even_when_chairman_said_pass():
    d = decide(OK, (CRIT,))
    assert d.verdict is Verdict.FAIL


def test_low_confidence_softens_only_a_pass():
    low = OK.model_copy(update={"confidence": 0.5})
    d = decide(low, ())
    assert (d.verdict, d.unclear_reason, d.exit_code) == (Verdict.UNCLEAR, "low_confidence", 2)
    assert d.inner_verdict == "pass"
    assert decide(low, (CRIT,)).verdict is Verdict.FAIL
    assert decide(OK.model_copy(update={"confidence": None}), ()).unclear_reason == (
        "low_confidence"
    )


def test_threshold_is_inclusive():
    d = decide(OK.model_copy(update={"confidence": 0.7, "confidence_threshold": 0.7}), ())
    assert d.verdict is Verdict.PASS


@pytest.mark.parametrize(
    "update",
    [
        {"stage1_ok": 1},
        {"stage1_ok": 0},
        {"stage2_ok": 0},
        {"verdict_parse": "error", "chairman_verdict": None},
    ],
)
def test_pass_without_valid_deliberation_is_unclear(update):
    d = decide(OK.model_copy(update=update), ())
    assert d.verdict is Verdict.UNCLEAR
    assert d.pass_blocked_by == "deliberation_invalid"
    assert d.unclear_reason == "infra_failure"


def test_a_single_member_council_needs_no_peer_review():
    solo = OK.model_copy(update={"stage1_ok": 1, "stage2_ok": 0, "min_stage1_reviewers": 1})
    assert decide(solo, ()).verdict is Verdict.PASS


def test_thin_deliberation_still_fails_on_evidence():
    assert decide(OK.model_copy(update={"stage1_ok": 1}), (CRIT,)).verdict is Verdict.FAIL


def test_chairman_rejecting_without_critical_is_unclear():
    d = decide(OK.model_copy(update={"chairman_verdict": "fail"}), (MAJOR,))
    assert d.verdict is Verdict.UNCLEAR
    assert d.pass_blocked_by == "chairman_contradicts_findings"


@pytest.mark.parametrize(
    ("outcome", "reason", "hint"),
    [
        ("failed", "infra_failure", False),
        ("not_run", "infra_failure", False),
        ("timed_out", "infra_failure", True),
        ("disabled", "chairman_disabled", False),
    ],
)
def test_chairman_outcomes_never_pass(outcome, reason, hint):
    d = decide(OK.model_copy(update={"chairman_outcome": outcome}), ())
    assert (d.verdict, d.unclear_reason, d.exit_code) == (Verdict.UNCLEAR, reason, 2)
    assert (d.retry_hint is not None) is hint


def test_deadline_fired_is_timeout_with_retry_hint():
    d = decide(OK.model_copy(update={"deadline_fired": True, "stage2_completed": True}), ())
    assert d.unclear_reason == "timeout"
    assert d.retry_hint is not None
    assert d.retry_hint.reason == "synthesis_starved"
    assert d.retry_hint.suggested_tier == Tier.HIGH
    d2 = decide(OK.model_copy(update={"deadline_fired": True}), ())
    assert d2.retry_hint is not None and d2.retry_hint.reason == "deadline_exhausted"


def test_retry_hint_never_goes_down_and_reduces_scope_at_the_top():
    assert retry_hint_for(Tier.QUICK, synthesis_starved=False).suggested_tier == Tier.BALANCED
    top = retry_hint_for(Tier.REASONING, synthesis_starved=True)
    assert (top.action, top.suggested_tier) == ("reduce_scope", None)


def test_input_errors():
    none = decide(OK.model_copy(update={"input_error": "no_reviewable_content"}), ())
    assert (none.verdict, none.exit_code, none.error) == (
        Verdict.UNCLEAR,
        3,
        "no_reviewable_content",
    )
    big = decide(OK.model_copy(update={"input_error": "input_too_large"}), ())
    assert (big.verdict, big.exit_code, big.error) == (Verdict.UNCLEAR, 2, "input_too_large")


def test_legacy_path_uses_the_verdict_block_not_prose():
    legacy = OK.model_copy(update={"structured": False})
    assert decide(legacy, ()).verdict is Verdict.PASS
    assert decide(legacy, ()).verdict_source == "legacy"
    assert (
        decide(legacy.model_copy(update={"chairman_verdict": "fail"}), ()).verdict is Verdict.FAIL
    )
    broken = legacy.model_copy(update={"verdict_parse": "error", "chairman_verdict": None})
    assert decide(broken, ()).verdict is Verdict.UNCLEAR


def test_findings_fallback_uses_the_verdict_block():
    fb = OK.model_copy(update={"findings_source": "fallback", "chairman_verdict": "fail"})
    assert decide(fb, ()).verdict is Verdict.FAIL


def _coverage(reason: str, policy: str = "clamp", changed: bool = True) -> CoverageReceipt:
    return CoverageReceipt(
        reviewed=("a.py",),
        omitted=(OmittedPath(path="b.zig", reason=reason, origin="discovered", changed=changed),),
        policy=policy,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("reason", ["non-text", "not_found", "truncated", "denied_secret"])
def test_clamp_turns_pass_into_incomplete_coverage(reason):
    d = decide(OK, (), _coverage(reason))
    assert (d.verdict, d.unclear_reason) == (Verdict.UNCLEAR, "incomplete_coverage")
    assert d.clamped is not None and d.clamped[0].path == "b.zig"


@pytest.mark.parametrize("reason", ["binary", "generated", "vendored", "too_large", "ignored"])
def test_acknowledged_omissions_do_not_clamp(reason):
    assert decide(OK, (), _coverage(reason)).verdict is Verdict.PASS


def test_warn_policy_and_unchanged_files_do_not_clamp():
    assert decide(OK, (), _coverage("non-text", policy="warn")).verdict is Verdict.PASS
    assert decide(OK, (), _coverage("non-text", changed=False)).verdict is Verdict.PASS


def test_ack_list_is_configurable():
    custom = OK.model_copy(update={"coverage_ack_reasons": ("non-text",)})
    assert decide(custom, (), _coverage("non-text")).verdict is Verdict.PASS
    assert decide(custom, (), _coverage("binary")).verdict is Verdict.UNCLEAR


def test_blocking_subset_is_critical_only():
    assert blocking_subset((CRIT, MAJOR, BLANK)) == (CRIT, BLANK)


# --- the payload re-derives itself -------------------------------------------------------------


def _payload(inputs: DecisionInputs, findings=(), coverage=None) -> VerifyResponse:
    d = decide(inputs, findings, coverage)
    if coverage is not None:
        coverage = coverage.model_copy(update={"clamped": d.clamped})
    return VerifyResponse(
        verification_id="v1",
        verdict=d.verdict,
        exit_code=d.exit_code,
        ci_should_fail=d.ci_should_fail,
        unclear_reason=d.unclear_reason,
        retry_hint=d.retry_hint,
        blocking_issues=d.blocking_issues,
        findings=findings,
        error=d.error,
        coverage=coverage,
        timeout_fired=inputs.deadline_fired,
        diagnostics=VerifyDiagnostics(
            inner_verdict=d.inner_verdict, pass_blocked_by=d.pass_blocked_by
        ),
        decision_inputs=inputs,
    )


def test_payload_round_trips_through_json():
    p = _payload(OK, (CRIT, MAJOR))
    again = VerifyResponse.model_validate_json(p.model_dump_json())
    assert again == p
    assert again.verdict is Verdict.FAIL


def test_payload_is_frozen():
    p = _payload(OK)
    with pytest.raises(ValueError):
        p.verdict = Verdict.FAIL  # type: ignore[misc]
    assert isinstance(p.findings, tuple)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("verdict", "pass"),
        ("exit_code", 0),
        ("ci_should_fail", False),
        ("blocking_issues", ()),
        ("unclear_reason", "low_confidence"),
    ],
)
def test_tampered_payload_is_rejected_in_code(field, value):
    p = _payload(OK, (CRIT,))
    data = p.model_dump()
    data[field] = value
    with pytest.raises(ValidationError, match="does not match its evidence"):
        VerifyResponse.model_validate(data)


@pytest.mark.parametrize(
    ("findings", "edit"),
    [
        ((CRIT,), lambda d: d.update(verdict="pass", exit_code=0, ci_should_fail=False)),
        ((CRIT,), lambda d: d.update(exit_code=0)),
        ((CRIT,), lambda d: d.update(blocking_issues=[])),
        ((CRIT,), lambda d: d["blocking_issues"].append(dict(d["blocking_issues"][0]))),
        ((), lambda d: d["decision_inputs"].update(confidence=0.1)),
        ((), lambda d: d["diagnostics"].update(inner_verdict=None)),
    ],
)
def test_tampered_payload_is_rejected_from_json(findings, edit):
    data = json.loads(_payload(OK, findings).model_dump_json())
    edit(data)
    with pytest.raises(ValidationError, match="does not match its evidence"):
        VerifyResponse.model_validate_json(json.dumps(data))


def test_a_pass_cannot_gain_a_blocking_issue():
    data = json.loads(_payload(OK).model_dump_json())
    data["blocking_issues"] = [{"severity": "critical", "description": "x"}]
    with pytest.raises(ValidationError, match="does not match its evidence"):
        VerifyResponse.model_validate_json(json.dumps(data))


def test_a_fail_cannot_become_a_pass_by_dropping_evidence_alone():
    data = json.loads(_payload(OK, (CRIT,)).model_dump_json())
    data["findings"] = []
    with pytest.raises(ValidationError, match="does not match its evidence"):
        VerifyResponse.model_validate_json(json.dumps(data))


def test_clamp_cannot_be_removed():
    cov = _coverage("not_found")
    data = json.loads(_payload(OK, (), cov).model_dump_json())
    assert data["verdict"] == "unclear"
    data["coverage"]["clamped"] = None
    with pytest.raises(ValidationError, match="does not match its evidence"):
        VerifyResponse.model_validate_json(json.dumps(data))
