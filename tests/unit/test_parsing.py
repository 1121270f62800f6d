"""JSON extraction and the three stage parsers, with property tests for the bad inputs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.models import Usage
from shared.parsing import (
    ParseError,
    coerce_confidence,
    extract_json_object,
    normalise_label,
    parse_chairman,
    parse_peer_review,
    parse_stage1,
)
from shared.providers.base import Completion

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
USAGE = Usage(prompt_tokens=100, completion_tokens=20, cached_tokens=64)


def done(text: str, finish: str | None = "stop") -> Completion:
    return Completion(text=text, usage=USAGE, finish_reason=finish, latency_ms=1234, attempts=2)


# --- strategies ----------------------------------------------------------------------------

texts = st.text(max_size=40)
findings = st.fixed_dictionaries(
    {
        "severity": st.sampled_from(["critical", "major", "minor", "info"]),
        "description": st.text(min_size=1, max_size=40).filter(lambda s: s.strip()),
        "location": st.one_of(st.none(), st.just("global"), st.just("src/app.py:12")),
        "dimension": st.one_of(st.none(), st.sampled_from(["accuracy", "clarity"])),
    }
)
stage1_answers = st.fixed_dictionaries(
    {
        "verdict": st.sampled_from(["pass", "fail"]),
        "confidence": st.floats(min_value=0, max_value=1),
        "summary": texts,
        "findings": st.lists(findings, max_size=4),
    }
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
objects = st.dictionaries(texts, json_values, min_size=1, max_size=5)
# Prose before the answer never opens a brace; prose after it may contain anything.
leading_prose = st.text(alphabet=st.characters(blacklist_characters="{"), max_size=60)
trailing_prose = st.text(max_size=60)


def serialise(obj: dict[str, Any], style: int) -> str:
    if style == 0:
        return json.dumps(obj)
    if style == 1:
        return json.dumps(obj, indent=2, ensure_ascii=False)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


@st.composite
def wrapped(draw: st.DrawFn, strategy: st.SearchStrategy[dict[str, Any]]) -> tuple[dict, str]:
    obj = draw(strategy)
    body = serialise(obj, draw(st.integers(0, 2)))
    fence = draw(st.sampled_from(["", "```json\n", "```\n", "```JSON\n"]))
    close = "\n```" if fence else ""
    text = draw(leading_prose) + fence + body + close + draw(trailing_prose)
    return obj, text


# --- extract_json_object -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '  {"a": 1}  \n',
        'Here is my review:\n```json\n{"a": 1}\n```\nThanks.',
        '```\n{"a": 1}\n```',
        'Sure. {"a": 1} Hope that helps {"b": 2}',
        'A note {like this} first, then {"a": 1}',
        'stray } brace then {"a": 1}',
    ],
)
def test_extracts_the_answer(text):
    assert extract_json_object(text) == {"a": 1}


def test_braces_inside_strings_do_not_count():
    assert extract_json_object('x {"s": "}{\\"}", "t": 1} y') == {"s": '}{"}', "t": 1}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("", "malformed"),
        ("no json here", "malformed"),
        ("{not json}", "malformed"),
        ('{"a": 1,}', "malformed"),
        ('{"a": ', "truncated"),
        ('```json\n{"a": {"b": 1}', "truncated"),
        ('{"a": "unterminated', "truncated"),
        ("[1, 2, 3]", "malformed"),
    ],
)
def test_reports_malformed_and_truncated(text, kind):
    with pytest.raises(ParseError) as info:
        extract_json_object(text)
    assert info.value.kind == kind


def test_error_messages_never_quote_the_output():
    secret = "SECRET-PAYLOAD-123"
    for text in (f'{{"a": "{secret}"', f"{{{secret}}}", f"prose {secret}"):
        with pytest.raises(ParseError) as info:
            extract_json_object(text)
        assert secret not in info.value.message


def test_deep_nesting_is_malformed_not_a_crash():
    text = "{" + '"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ParseError):
        extract_json_object(text)


@PROPS
@given(wrapped(objects))
def test_any_object_survives_prose_fences_and_trailing_text(case):
    obj, text = case
    assert extract_json_object(text) == obj


@PROPS
@given(objects, st.integers(0, 2), st.data())
def test_a_strict_prefix_is_truncated_or_malformed_never_a_wrong_object(obj, style, data):
    body = serialise(obj, style)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(ParseError) as info:
        extract_json_object(body[:cut])
    assert info.value.kind in ("truncated", "malformed")
    if body[:cut].strip():
        assert info.value.kind == "truncated"


@PROPS
@given(st.text(max_size=300))
def test_arbitrary_text_raises_only_parse_error(text):
    try:
        result = extract_json_object(text)
    except ParseError as exc:
        assert exc.kind in ("malformed", "truncated")
    else:
        assert isinstance(result, dict)


# --- stage 1 -------------------------------------------------------------------------------


@PROPS
@given(wrapped(stage1_answers))
def test_stage1_answers_survive_wrapping(case):
    obj, text = case
    answer = parse_stage1("m", done(text))
    assert answer.ok and answer.error is None
    assert answer.verdict == obj["verdict"]
    assert answer.confidence == pytest.approx(obj["confidence"])
    assert answer.summary == obj["summary"].strip()
    assert [f.severity for f in answer.findings] == [f["severity"] for f in obj["findings"]]
    assert [f.location for f in answer.findings] == [f["location"] for f in obj["findings"]]
    assert answer.usage == USAGE and answer.latency_ms == 1234


def test_stage1_coerces_findings():
    text = json.dumps(
        {
            "verdict": "FAIL",
            "confidence": 1.7,
            "summary": "sql injection",
            "findings": [
                {"description": "no severity", "location": {"file": "a.py", "line": 3}},
                {"severity": "Major", "description": "m", "location": "null"},
                {"severity": "minor", "message": "alt key", "file": "b.py", "line": "9"},
                "a bare string finding",
                42,
                None,
                {},
            ],
        }
    )
    answer = parse_stage1("m", done(text))
    assert answer.ok and answer.verdict == "fail"
    assert answer.confidence == pytest.approx(0.017)  # 1.7 read as a percentage
    sev = [(f.severity, f.description, f.location) for f in answer.findings]
    assert sev == [
        ("", "no severity", "a.py:3"),
        ("major", "m", None),
        ("minor", "alt key", "b.py:9"),
        ("", "a bare string finding", None),
    ]
    assert answer.findings[0].effective_severity.value == "critical"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.4, 0.4),
        (1, 1.0),
        (0, 0.0),
        (-0.3, 0.0),
        (85, 0.85),
        ("0.9", 0.9),
        ("70%", 0.7),
        (250, None),
        ("high", None),
        (None, None),
        (True, None),
        (float("nan"), None),
    ],
)
def test_confidence(value, expected):
    got = coerce_confidence(value)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_stage1_truncated_when_cut_at_the_token_limit():
    answer = parse_stage1("m", done('{"verdict": "pass", "summ', finish="length"))
    assert not answer.ok and answer.error is not None
    assert answer.error.kind == "truncated"
    # Even garbage is reported as truncated when the model ran out of tokens.
    answer = parse_stage1("m", done("I think the code", finish="length"))
    assert answer.error is not None and answer.error.kind == "truncated"


def test_stage1_malformed():
    for text in ("nope", '{"summary": "no verdict, no findings"}', '{"verdict": "maybe"}'):
        answer = parse_stage1("m", done(text))
        assert not answer.ok and answer.error is not None
        assert answer.error.kind == "malformed"
        assert answer.error.attempts == 2
        assert answer.usage == USAGE


def test_stage1_findings_without_verdict_is_usable():
    answer = parse_stage1("m", done('{"findings": [{"severity": "info", "description": "d"}]}'))
    assert answer.ok and answer.verdict is None and len(answer.findings) == 1


@PROPS
@given(st.text(max_size=300))
def test_stage1_never_raises(text):
    assert parse_stage1("m", done(text)).model == "m"


@PROPS
@given(objects)
def test_stage1_never_raises_on_odd_objects(obj):
    parse_stage1("m", done(json.dumps(obj)))
    parse_stage1("m", done(json.dumps({"verdict": "pass", "findings": list(obj.values())})))


# --- stage 2 -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "label"),
    [
        ("Response A", "A"),
        ("response a", "A"),
        ("A", "A"),
        ("Response: A", "A"),
        ("**Response B**", "B"),
        ("ResponseC", "C"),
        ("Response Z", None),
        ("Apple", None),
        (3, None),
        ({"label": "B"}, "B"),
    ],
)
def test_normalise_label(value, label):
    assert normalise_label(value, ["A", "B", "C"]) == label


def test_peer_review_normalises_ranking_and_scores():
    text = json.dumps(
        {
            "ranking": ["Response C", "response a", "A", "Response: B", "Response Q"],
            "scores": {
                "Response A": {
                    "accuracy": 12,
                    "relevance": -1,
                    "clarity": "7",
                    "completeness": "x",
                },
                "c": {"accuracy": 8.5},
                "Response Q": {"accuracy": 1},
                "B": "not an object",
            },
            "findings": [{"severity": "critical", "description": "all missed it"}],
        }
    )
    review = parse_peer_review("r", done(text), ["A", "B", "C"])
    assert review.ok
    assert review.ranking == ("C", "A", "B")
    assert set(review.scores) == {"A", "C"}
    a = review.scores["A"]
    assert (a.accuracy, a.relevance, a.clarity, a.completeness) == (10.0, 0.0, 7.0, None)
    assert review.scores["C"].accuracy == 8.5
    assert len(review.findings) == 1
    assert review.usage == USAGE and review.latency_ms == 1234


def test_peer_review_ranking_as_a_string():
    review = parse_peer_review("r", done('{"ranking": "Response B > Response A"}'), ["A", "B"])
    assert review.ok and review.ranking == ("B", "A")


@pytest.mark.parametrize(
    "text",
    ['{"ranking": []}', '{"ranking": ["Response X"]}', '{"scores": {}}', "no json"],
)
def test_peer_review_without_usable_ranking_is_malformed(text):
    review = parse_peer_review("r", done(text), ["A", "B"])
    assert not review.ok and review.error is not None
    assert review.error.kind == "malformed"


@PROPS
@given(st.text(max_size=300))
def test_peer_review_never_raises(text):
    parse_peer_review("r", done(text), ["A", "B", "C"])


@PROPS
@given(objects)
def test_peer_review_never_raises_on_odd_objects(obj):
    parse_peer_review("r", done(json.dumps(obj)), ["A", "B"])
    values = list(obj.values())
    odd = {"ranking": values, "scores": dict(obj), "findings": values}
    parse_peer_review("r", done(json.dumps(odd)), ["A", "B"])


# --- chairman ------------------------------------------------------------------------------


def chair(payload: dict[str, Any]) -> str:
    base = {
        "verdict": "fail",
        "confidence": 0.9,
        "rationale": "The query is built by string formatting.",
        "findings": [
            {
                "severity": "critical",
                "description": "SQL injection",
                "location": "a.py:6",
                "dimension": "accuracy",
            }
        ],
        "rubric_scores": {"accuracy": 9, "relevance": 11, "clarity": None},
    }
    base.update(payload)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def test_chairman_structured():
    report = parse_chairman("ch", done(chair({})))
    assert report.ok and report.error is None
    assert report.verdict == "fail" and report.verdict_parse == "ok"
    assert report.verdict_parse_error is None
    assert report.findings_source == "structured" and report.fallback_reason is None
    assert report.findings[0].severity == "critical"
    assert report.confidence == 0.9
    assert report.rationale.startswith("The query")
    assert report.rubric_scores.accuracy == 9 and report.rubric_scores.relevance == 10
    assert report.rubric_scores.clarity is None
    assert report.usage == USAGE and report.latency_ms == 1234


def test_chairman_verdict_is_case_insensitive():
    assert parse_chairman("ch", done(chair({"verdict": " PASS "}))).verdict == "pass"


@pytest.mark.parametrize("verdict", ["approve", "reject", "unclear", 1, None, ...])
def test_chairman_bad_or_missing_verdict_is_a_parse_error(verdict):
    report = parse_chairman("ch", done(chair({"verdict": verdict})))
    assert report.ok
    assert report.verdict is None and report.verdict_parse == "error"
    assert report.verdict_parse_error
    if isinstance(verdict, str):
        assert verdict not in report.verdict_parse_error  # never the payload


@pytest.mark.parametrize(("findings", "reason"), [(..., "no 'findings'"), ("none", "str")])
def test_chairman_findings_not_a_list_falls_back(findings, reason):
    report = parse_chairman("ch", done(chair({"findings": findings})))
    assert report.ok and report.verdict == "fail"
    assert report.findings_source == "fallback"
    assert report.fallback_reason and reason in report.fallback_reason
    assert report.findings == ()


@pytest.mark.parametrize(
    ("text", "finish", "kind"),
    [
        ("The change looks fine overall.", "stop", "malformed"),
        ('{"verdict": "pass", "rationale": "cut', "stop", "truncated"),
        ('{"verdict": "pass", "rationale": "cut', "length", "truncated"),
        ("cut off prose", "length", "truncated"),
    ],
)
def test_chairman_unparseable(text, finish, kind):
    report = parse_chairman("ch", done(text, finish))
    assert not report.ok and report.error is not None
    assert report.error.kind == kind
    assert report.verdict is None and report.verdict_parse == "error"
    assert report.verdict_parse_error and report.verdict_parse_error.startswith("ParseError: ")
    assert "cut" not in report.verdict_parse_error and "fine" not in report.verdict_parse_error
    assert report.findings_source == "fallback"


@PROPS
@given(st.text(max_size=300))
def test_chairman_never_raises(text):
    report = parse_chairman("ch", done(text))
    assert report.verdict_parse in ("ok", "error")


@PROPS
@given(objects)
def test_chairman_never_raises_on_odd_objects(obj):
    parse_chairman("ch", done(json.dumps(obj)))
    values = list(obj.values())
    odd = {"verdict": values[0], "findings": values, "rubric_scores": obj, "confidence": values}
    parse_chairman("ch", done(json.dumps(odd)))
