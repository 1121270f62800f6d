"""Read model output: find the JSON object in it, then turn it into stage results.

`extract_json_object` accepts a bare object, a fenced block (```json or ```), prose before
or after: it returns the first balanced top-level `{...}` that is valid JSON (brace matching
that knows JSON strings, so braces inside strings do not count). A `{` that never closes is
reported as truncated, never answered with an object nested inside it: that object would be
a fragment of the cut-off answer. A balanced `{...}` that is not JSON (prose like "{x}") is
skipped.

The stage parsers never raise: an unusable answer comes back with `ok=False` and a
`ProviderFailure` of kind `malformed` or `truncated`. Error messages describe the output
(its length, where parsing failed), never quote it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from shared.models import (
    RUBRIC_DIMENSIONS,
    ChairmanReport,
    Finding,
    PeerReview,
    ProviderFailure,
    RubricScores,
    Stage1Answer,
)
from shared.providers.base import Completion

ParseKind = Literal["malformed", "truncated"]

_SPECIAL = re.compile(r'[{}"\\]')
_FINDING_TEXT_KEYS = ("description", "message", "issue", "title", "text", "detail", "summary")
_LABEL = re.compile(
    r"^[\W_]*(?:(?:response|answer|candidate)[\W_]*)?([A-Za-z]{1,2})(?![A-Za-z])",
    re.IGNORECASE,
)
_RANKING_SPLIT = re.compile(r"[,;>\n]+")


class ParseError(ValueError):
    """Model output without a usable JSON object. `kind` is "malformed" or "truncated"."""

    def __init__(self, kind: ParseKind, message: str) -> None:
        super().__init__(message)
        self.kind: ParseKind = kind
        self.message = message


# --- JSON extraction -----------------------------------------------------------------------


def _match_brace(text: str, start: int) -> int | None:
    """Index of the `}` closing the `{` at `start`, or None if it never closes."""
    depth = 0
    in_string = False
    skip_to = -1
    for m in _SPECIAL.finditer(text, start):
        pos = m.start()
        if pos < skip_to:
            continue
        ch = m.group()
        if in_string:
            if ch == "\\":
                skip_to = pos + 2
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return pos
    return None


def _top_level_spans(text: str) -> Iterator[tuple[int, int | None]]:
    """(start, end or None) of each top-level `{...}` in order; stops after one that never
    closes (everything after its `{` is inside it)."""
    start = text.find("{")
    while start != -1:
        end = _match_brace(text, start)
        yield start, end
        if end is None:
            return
        start = text.find("{", end + 1)


def _loads_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text, strict=False)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _decode_error(text: str) -> str:
    try:
        json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at offset {exc.pos}"
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__
    return "not an object"


def extract_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a model's output. Raises ParseError (malformed or truncated)."""
    if not isinstance(text, str):
        raise ParseError("malformed", f"output is {type(text).__name__}, not text")
    stripped = text.strip()
    if stripped.startswith("{"):
        whole = _loads_object(stripped)
        if whole is not None:
            return whole
    first_error: str | None = None
    for start, end in _top_level_spans(text):
        if end is None:
            raise ParseError(
                "truncated",
                f"the JSON object opened at offset {start} never closes "
                f"(output is {len(text)} chars)",
            )
        candidate = text[start : end + 1]
        obj = _loads_object(candidate)
        if obj is not None:
            return obj
        if first_error is None:
            first_error = f"{_decode_error(candidate)} in the object at offset {start}"
    if first_error is not None:
        raise ParseError("malformed", f"no valid JSON object in the output: {first_error}")
    if not stripped:
        raise ParseError("malformed", "the output is empty")
    raise ParseError("malformed", f"no JSON object in the output ({len(text)} chars)")


# --- value coercion ------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        text = value.strip().rstrip("%").strip()
        try:
            number = float(text)
        except ValueError:
            return None
        if value.strip().endswith("%"):
            number /= 100.0
    elif isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def coerce_confidence(value: Any) -> float | None:
    """Confidence in [0, 1]. A number in (1, 100] is read as a percentage (85 -> 0.85);
    negatives clamp to 0; anything else (text, > 100, NaN) is None."""
    number = _number(value)
    if number is None or number > 100:
        return None
    if number > 1:
        number /= 100.0
    return max(0.0, number)


def coerce_score(value: Any) -> float | None:
    """A rubric score clamped to [0, 10]; unreadable is None."""
    number = _number(value)
    return None if number is None else min(10.0, max(0.0, number))


def coerce_scores(value: Any) -> RubricScores:
    if not isinstance(value, Mapping):
        return RubricScores()
    lowered = {str(k).strip().lower(): v for k, v in value.items()}
    return RubricScores(**{d: coerce_score(lowered.get(d)) for d in RUBRIC_DIMENSIONS})


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int | float | bool):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return ""


def _location(value: Any, item: Mapping[str, Any]) -> str | None:
    if isinstance(value, str):
        text = value.strip()
        return None if text.lower() in ("", "null", "none", "n/a") else text
    source: Mapping[str, Any] = value if isinstance(value, Mapping) else item
    path = source.get("file", source.get("path"))
    if not isinstance(path, str) or not path.strip():
        return None
    line = source.get("line")
    if isinstance(line, int) and not isinstance(line, bool):
        return f"{path.strip()}:{line}"
    if isinstance(line, str) and line.strip().isdigit():
        return f"{path.strip()}:{line.strip()}"
    return path.strip()


def coerce_finding(item: Any) -> Finding | None:
    """A Finding from what a model wrote, or None for an entry that carries nothing.

    A bare string becomes a finding with no severity (so the engine counts it critical:
    an issue the model raised without grading it is not dropped). A missing severity
    stays blank, which the engine also treats as critical.
    """
    if isinstance(item, str):
        text = item.strip()
        return Finding(severity="", description=text) if text else None
    if not isinstance(item, Mapping):
        return None
    severity = item.get("severity")
    description = ""
    for key in _FINDING_TEXT_KEYS:
        description = _text(item.get(key))
        if description:
            break
    severity_text = "" if severity is None else _text(severity)
    if not severity_text and not description:
        return None
    dimension = _text(item.get("dimension")).lower() or None
    return Finding(
        severity=severity_text,
        description=description,
        location=_location(item.get("location"), item),
        dimension=dimension,
    )


def coerce_findings(value: Any) -> tuple[Finding, ...] | None:
    """Findings from a list (entries that carry nothing are dropped); None if not a list."""
    if not isinstance(value, list):
        return None
    return tuple(f for f in (coerce_finding(item) for item in value) if f is not None)


def _verdict(value: Any) -> Literal["pass", "fail"] | None:
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "pass":
            return "pass"
        if text == "fail":
            return "fail"
    return None


def _failure(completion: Completion, exc: ParseError) -> ProviderFailure:
    kind: ParseKind = "truncated" if completion.finish_reason == "length" else exc.kind
    message = exc.message
    if kind == "truncated" and completion.finish_reason == "length":
        message = f"output hit the token limit: {message}"
    return ProviderFailure(kind=kind, message=message, attempts=completion.attempts)


def _unexpected(completion: Completion, exc: Exception) -> ProviderFailure:
    return ProviderFailure(
        kind="malformed",
        message=f"could not read the answer: {type(exc).__name__}",
        attempts=completion.attempts,
    )


# --- stage 1 -------------------------------------------------------------------------------


def parse_stage1(model: str, completion: Completion) -> Stage1Answer:
    """A stage-1 answer; ok=False (malformed/truncated) when it carries no verdict and no
    findings list."""
    common: dict[str, Any] = {
        "model": model,
        "usage": completion.usage,
        "latency_ms": completion.latency_ms,
    }
    try:
        data = extract_json_object(completion.text)
    except ParseError as exc:
        return Stage1Answer(ok=False, error=_failure(completion, exc), **common)
    try:
        verdict = _verdict(data.get("verdict"))
        findings = coerce_findings(data.get("findings"))
        if findings is None and isinstance(data.get("findings"), Mapping):
            single = coerce_finding(data["findings"])
            findings = (single,) if single else ()
        if verdict is None and findings is None:
            return Stage1Answer(
                ok=False,
                error=ProviderFailure(
                    kind="malformed",
                    message="the answer has neither a pass/fail verdict nor a findings list",
                    attempts=completion.attempts,
                ),
                **common,
            )
        return Stage1Answer(
            ok=True,
            verdict=verdict,
            confidence=coerce_confidence(data.get("confidence")),
            summary=_text(data.get("summary")),
            findings=findings or (),
            **common,
        )
    except Exception as exc:  # never let one odd answer stop the council
        return Stage1Answer(ok=False, error=_unexpected(completion, exc), **common)


# --- stage 2 -------------------------------------------------------------------------------


def normalise_label(value: Any, labels: Sequence[str]) -> str | None:
    """ "Response A", "response a", "A", "Response: A" -> "A" when "A" is a known label."""
    if isinstance(value, Mapping):
        value = value.get("label", value.get("response", value.get("id")))
    if not isinstance(value, str):
        return None
    known = {label.upper(): label for label in labels}
    text = value.strip()
    if text.upper() in known:
        return known[text.upper()]
    m = _LABEL.match(text)
    if not m:
        return None
    return known.get(m.group(1).upper())


def _ranking(value: Any, labels: Sequence[str]) -> tuple[str, ...]:
    entries: list[Any]
    if isinstance(value, str):
        entries = list(_RANKING_SPLIT.split(value))
    elif isinstance(value, list):
        entries = value
    else:
        return ()
    out: list[str] = []
    for entry in entries:
        label = normalise_label(entry, labels)
        if label is not None and label not in out:
            out.append(label)
    return tuple(out)


def parse_peer_review(reviewer: str, completion: Completion, labels: Sequence[str]) -> PeerReview:
    """A stage-2 review; ok=False (malformed/truncated) without a ranking of known labels."""
    common: dict[str, Any] = {
        "reviewer": reviewer,
        "usage": completion.usage,
        "latency_ms": completion.latency_ms,
    }
    try:
        data = extract_json_object(completion.text)
    except ParseError as exc:
        return PeerReview(ok=False, error=_failure(completion, exc), **common)
    try:
        ranking = _ranking(data.get("ranking"), labels)
        if not ranking:
            return PeerReview(
                ok=False,
                error=ProviderFailure(
                    kind="malformed",
                    message=f"the ranking names none of the responses {', '.join(labels)}",
                    attempts=completion.attempts,
                ),
                **common,
            )
        scores: dict[str, RubricScores] = {}
        raw_scores = data.get("scores")
        if isinstance(raw_scores, Mapping):
            for key, value in raw_scores.items():
                label = normalise_label(key, labels)
                if label is not None and label not in scores and isinstance(value, Mapping):
                    scores[label] = coerce_scores(value)
        return PeerReview(
            ok=True,
            ranking=ranking,
            scores=scores,
            findings=coerce_findings(data.get("findings")) or (),
            **common,
        )
    except Exception as exc:  # never let one odd review stop the council
        return PeerReview(ok=False, error=_unexpected(completion, exc), **common)


# --- chairman ------------------------------------------------------------------------------


def parse_chairman(model: str, completion: Completion) -> ChairmanReport:
    """The chairman's report.

    Unparseable output: ok=False, verdict_parse "error". Parsed: the verdict must be
    "pass" or "fail" (any case), otherwise verdict_parse "error" with the reason; findings
    must be a list for findings_source "structured", otherwise "fallback" with the reason.
    """
    common: dict[str, Any] = {
        "model": model,
        "usage": completion.usage,
        "latency_ms": completion.latency_ms,
    }
    try:
        data = extract_json_object(completion.text)
    except ParseError as exc:
        failure = _failure(completion, exc)
        return ChairmanReport(
            ok=False,
            error=failure,
            verdict_parse="error",
            verdict_parse_error=f"ParseError: {failure.message}",
            findings_source="fallback",
            fallback_reason=f"the chairman's output is not a JSON object ({failure.kind})",
            **common,
        )
    try:
        return _chairman_from(data, common)
    except Exception as exc:  # never let one odd report stop the verdict
        failure = _unexpected(completion, exc)
        return ChairmanReport(
            ok=False,
            error=failure,
            verdict_parse="error",
            verdict_parse_error=f"{type(exc).__name__}: could not read the chairman's report",
            findings_source="fallback",
            fallback_reason="the chairman's report could not be read",
            **common,
        )


def _chairman_from(data: Mapping[str, Any], common: dict[str, Any]) -> ChairmanReport:
    verdict_parse: Literal["ok", "error"] = "ok"
    verdict_error: str | None = None
    if "verdict" not in data:
        verdict_parse, verdict_error = "error", "KeyError: the report has no 'verdict' field"
    verdict = _verdict(data.get("verdict"))
    if verdict is None and verdict_error is None:
        raw = data.get("verdict")
        verdict_parse = "error"
        verdict_error = (
            "ValueError: 'verdict' must be 'pass' or 'fail', "
            f"got {'an unrecognised string' if isinstance(raw, str) else type(raw).__name__}"
        )

    raw_findings = data.get("findings")
    findings = coerce_findings(raw_findings)
    source: Literal["structured", "fallback"] = "structured"
    fallback_reason: str | None = None
    if findings is None:
        source = "fallback"
        fallback_reason = (
            "the report has no 'findings' field"
            if "findings" not in data
            else f"'findings' is {type(raw_findings).__name__}, not a list"
        )
        findings = ()

    return ChairmanReport(
        ok=True,
        verdict=verdict,
        verdict_parse=verdict_parse,
        verdict_parse_error=verdict_error,
        confidence=coerce_confidence(data.get("confidence")),
        rationale=_text(data.get("rationale")),
        findings=findings,
        findings_source=source,
        fallback_reason=fallback_reason,
        rubric_scores=coerce_scores(data.get("rubric_scores")),
        **common,
    )
