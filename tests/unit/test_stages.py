"""Stage functions: anonymisation, Borda aggregation, agreement, stage calls with a stub client."""

from __future__ import annotations

import json
import time

import pytest

from shared.models import PeerReview, ProviderFailure, Stage, Stage1Answer, Usage
from shared.providers.base import Completion, ProviderError
from shared.stages import (
    aggregate,
    answer_body,
    assign_labels,
    combined_confidence,
    peer_answers,
    run_stage1,
    run_stage2,
)
from shared.transcript import seal, validate

MODELS = ("openai:a", "openai:b", "openai:c", "openai:d")


class StubClient:
    def __init__(self, reply: str | Exception) -> None:
        self.reply = reply
        self.calls: list[dict] = []

    def complete(self, ref, **kw) -> Completion:
        self.calls.append({"ref": ref, **kw})
        if isinstance(self.reply, Exception):
            raise self.reply
        return Completion(text=self.reply, usage=Usage(prompt_tokens=10))


def test_labels_are_one_seeded_shuffle():
    a = assign_labels(MODELS, 42)
    assert a == assign_labels(MODELS, 42)
    assert sorted(a) == ["A", "B", "C", "D"] and sorted(a.values()) == sorted(MODELS)
    assert any(assign_labels(MODELS, s) != a for s in range(1, 20))


def test_peer_answers_exclude_the_reviewer_and_never_name_models():
    answers = {
        m: Stage1Answer(model=m, ok=True, verdict="pass", confidence=0.9, summary=f"by {i}")
        for i, m in enumerate(MODELS)
    }
    labels = assign_labels(MODELS, 3)
    shown = peer_answers(labels, answers, exclude="openai:a")
    assert len(shown) == 3
    own = next(label for label, m in labels.items() if m == "openai:a")
    assert own not in [label for label, _ in shown]
    assert all("openai:" not in body for _, body in shown)
    assert json.loads(answer_body(answers["openai:b"]))["summary"] == "by 1"


def _review(reviewer: str, ranking: tuple[str, ...]) -> PeerReview:
    return PeerReview(reviewer=reviewer, ok=True, ranking=ranking)


def test_borda_excludes_self_votes():
    labels = {"A": "openai:a", "B": "openai:b", "C": "openai:c"}
    # b ranks itself first (it should not have been shown itself; the vote must not count)
    reviews = [
        _review("openai:a", ("B", "C")),
        _review("openai:b", ("B", "C", "A")),
        _review("openai:c", ("B", "A")),
    ]
    agg = aggregate(labels, reviews, seed=1)
    assert agg.borda == {"openai:a": 0.0, "openai:b": 2.0, "openai:c": 1.0}
    assert agg.ranking[0] == "openai:b"
    assert agg.seed == 1


def test_agreement_measures_ranking_concordance():
    labels = {"A": "openai:a", "B": "openai:b", "C": "openai:c", "D": "openai:d"}
    same = [_review("openai:a", ("B", "C", "D")), _review("openai:b", ("C", "D", "A"))]
    assert aggregate(labels, same, 0).agreement == 1.0
    opposite = [_review("openai:a", ("B", "C", "D")), _review("openai:b", ("D", "C", "A"))]
    assert aggregate(labels, opposite, 0).agreement == 0.0
    assert aggregate(labels, same[:1], 0).agreement is None
    failed = PeerReview(reviewer="openai:c", ok=False)
    assert aggregate(labels, [*same, failed], 0).agreement == 1.0


def test_combined_confidence():
    assert combined_confidence(0.9, 1.0) == 0.95
    assert combined_confidence(0.9, None) == 0.9
    assert combined_confidence(None, 1.0) is None


def test_stage1_parses_and_labels_the_call():
    reply = json.dumps(
        {
            "verdict": "fail",
            "confidence": 0.8,
            "summary": "s",
            "findings": [
                {
                    "severity": "critical",
                    "description": "d",
                    "location": "a.py:1",
                    "dimension": "accuracy",
                }
            ],
        }
    )
    client = StubClient(reply)
    ans = run_stage1(client, "openai:a", prefix="PREFIX", verification_id="v1", timeout_s=5)
    assert ans.ok and ans.verdict == "fail" and ans.findings[0].location == "a.py:1"
    call = client.calls[0]
    assert call["meta"].stage is Stage.STAGE1 and call["meta"].verification_id == "v1"
    assert call["cacheable_prefix"] == "PREFIX"
    assert "COUNCIL STAGE: stage1" in call["prompt"]
    assert call["deadline_at"] <= time.time() + 5  # the cap bounds the call with its retries


def test_stage_failures_are_markers_not_exceptions():
    failure = ProviderFailure(kind="billing", status=402, message="billing: no credits")
    ans = run_stage1(
        StubClient(ProviderError(failure)), "openai:a", prefix="", verification_id="v", timeout_s=5
    )
    assert (ans.ok, ans.error) == (False, failure)
    boom = run_stage2(
        StubClient(RuntimeError("bug")),
        "openai:a",
        prefix="",
        shown=[("A", "{}")],
        verification_id="v",
        timeout_s=5,
    )
    assert not boom.ok and boom.error is not None and "RuntimeError" in boom.error.message
    late = run_stage1(StubClient("{}"), "openai:a", prefix="", verification_id="v", timeout_s=0.01)
    assert late.error is not None and late.error.kind == "timeout"


@pytest.mark.parametrize("text", ["not json", '{"verdict": "pa', ""])
def test_unparseable_stage1_is_a_failed_answer(text):
    ans = run_stage1(StubClient(text), "openai:a", prefix="", verification_id="v", timeout_s=5)
    assert not ans.ok and ans.error is not None
    assert ans.error.kind in ("malformed", "truncated")


def test_transcript_integrity(tmp_path):
    (tmp_path / "result.json").write_text("{}")
    (tmp_path / "stage1.json").write_text("[]")
    seal(tmp_path)
    assert validate(tmp_path) == []
    (tmp_path / "stage1.json").write_text('["edited"]')
    assert validate(tmp_path) == ["stage1.json was altered"]
    (tmp_path / "extra.json").write_text("{}")
    assert "extra.json was added after sealing" in validate(tmp_path)
    (tmp_path / "result.json").unlink()
    assert "result.json is missing" in validate(tmp_path)
