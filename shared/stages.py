"""The three council stages as plain functions: a provider client and values in, models out.

Stage functions never raise for a model's failure; they return the answer with `ok=False`
and an error marker, so one dead model cannot stall the council.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Mapping, Sequence

from shared.budget import MIN_CALL_S
from shared.models import (
    Aggregate,
    ChairmanReport,
    Finding,
    PeerReview,
    ProviderFailure,
    Stage,
    Stage1Answer,
)
from shared.parsing import parse_chairman, parse_peer_review, parse_stage1
from shared.prompts import (
    SCHEMAS,
    SYSTEM_PROMPT,
    answer_json,
    chairman_prompt,
    stage1_prompt,
    stage2_prompt,
)
from shared.providers.base import CallMeta, Completion, ProviderClient, ProviderError
from shared.providers.refs import parse_model_ref


def _call(
    client: ProviderClient,
    model: str,
    stage: Stage,
    *,
    prefix: str,
    prompt: str,
    verification_id: str,
    timeout_s: float,
    deadline_at: float | None,
) -> Completion | ProviderFailure:
    if timeout_s < MIN_CALL_S:
        return ProviderFailure(kind="timeout", message=f"no time left for {stage.value} call")
    # The per-call cap bounds the call with all its retries, not each attempt alone.
    call_end = time.time() + timeout_s
    deadline_at = call_end if deadline_at is None else min(deadline_at, call_end)
    try:
        return client.complete(
            parse_model_ref(model),
            system=SYSTEM_PROMPT,
            cacheable_prefix=prefix,
            prompt=prompt,
            schema=SCHEMAS[stage],
            schema_name=f"council_{stage.value}",
            timeout_s=timeout_s,
            deadline_at=deadline_at,
            meta=CallMeta(verification_id=verification_id, stage=stage),
        )
    except ProviderError as exc:
        return exc.failure
    except Exception as exc:  # a bug in a client must not stall the council
        return ProviderFailure(kind="error", message=f"{type(exc).__name__}: {exc}"[:500])


def run_stage1(
    client: ProviderClient,
    model: str,
    *,
    prefix: str,
    verification_id: str,
    timeout_s: float,
    deadline_at: float | None = None,
) -> Stage1Answer:
    result = _call(
        client,
        model,
        Stage.STAGE1,
        prefix=prefix,
        prompt=stage1_prompt(),
        verification_id=verification_id,
        timeout_s=timeout_s,
        deadline_at=deadline_at,
    )
    if isinstance(result, ProviderFailure):
        return Stage1Answer(model=model, ok=False, error=result)
    return parse_stage1(model, result)


# --- anonymisation -------------------------------------------------------------------------


def _label(i: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return letters[i] if i < 26 else f"{letters[i // 26 - 1]}{letters[i % 26]}"


def assign_labels(models: Sequence[str], seed: int) -> dict[str, str]:
    """One shuffle per run: label -> model, e.g. {"A": "openai:gpt-5.1", ...}."""
    order = list(models)
    random.Random(seed).shuffle(order)
    return {_label(i): m for i, m in enumerate(order)}


def answer_body(answer: Stage1Answer) -> str:
    """What peers and the chairman see of a stage-1 answer: its content, never its model."""
    return answer_json(
        {
            "verdict": answer.verdict,
            "confidence": answer.confidence,
            "summary": answer.summary,
            "findings": [f.model_dump() for f in answer.findings],
        }
    )


def peer_answers(
    labels: Mapping[str, str], answers: Mapping[str, Stage1Answer], exclude: str | None
) -> list[tuple[str, str]]:
    """(label, body) pairs in label order, without `exclude`'s own answer."""
    return [
        (label, answer_body(answers[model]))
        for label, model in sorted(labels.items())
        if model != exclude
    ]


def run_stage2(
    client: ProviderClient,
    reviewer: str,
    *,
    prefix: str,
    shown: Sequence[tuple[str, str]],
    verification_id: str,
    timeout_s: float,
    deadline_at: float | None = None,
) -> PeerReview:
    result = _call(
        client,
        reviewer,
        Stage.STAGE2,
        prefix=prefix,
        prompt=stage2_prompt(shown),
        verification_id=verification_id,
        timeout_s=timeout_s,
        deadline_at=deadline_at,
    )
    if isinstance(result, ProviderFailure):
        return PeerReview(reviewer=reviewer, ok=False, error=result)
    return parse_peer_review(reviewer, result, [label for label, _ in shown])


# --- aggregation -----------------------------------------------------------------------------


def _pair_agreement(a: Sequence[str], b: Sequence[str]) -> float | None:
    common = [x for x in a if x in set(b)]
    pairs = list(itertools.combinations(common, 2))
    if not pairs:
        return None
    pos_b = {x: i for i, x in enumerate(b)}
    concordant = sum(1 for x, y in pairs if pos_b[x] < pos_b[y])  # x before y in a
    return concordant / len(pairs)


def aggregate(labels: Mapping[str, str], reviews: Sequence[PeerReview], seed: int) -> Aggregate:
    """Borda count over the peer rankings (self-votes excluded) and pairwise agreement.

    A ranking of n responses gives n-1 points to the first, 0 to the last. Agreement is the
    mean, over reviewer pairs, of the fraction of commonly ranked pairs both order alike.
    """
    points = dict.fromkeys(labels.values(), 0.0)
    valid = [r for r in reviews if r.ok and r.ranking]
    for review in valid:
        ranked = [label for label in review.ranking if labels.get(label) != review.reviewer]
        for i, label in enumerate(ranked):
            if label in labels:
                points[labels[label]] += len(ranked) - 1 - i
    label_of = {m: lab for lab, m in labels.items()}
    ranking = tuple(sorted(points, key=lambda m: (-points[m], label_of[m])))
    scores = [
        s
        for a, b in itertools.combinations(valid, 2)
        if (s := _pair_agreement(a.ranking, b.ranking)) is not None
    ]
    agreement = round(sum(scores) / len(scores), 4) if scores else None
    return Aggregate(
        seed=seed, labels=dict(labels), borda=points, ranking=ranking, agreement=agreement
    )


def combined_confidence(chairman: float | None, agreement: float | None) -> float | None:
    """Council confidence: the chairman's self-report, averaged with peer agreement."""
    if chairman is None:
        return None
    if agreement is None:
        return round(chairman, 4)
    return round((chairman + agreement) / 2, 4)


# --- chairman ---------------------------------------------------------------------------------


def run_chairman(
    client: ProviderClient,
    chairman: str,
    *,
    prefix: str,
    labels: Mapping[str, str],
    answers: Mapping[str, Stage1Answer],
    agg: Aggregate,
    verification_id: str,
    timeout_s: float,
    deadline_at: float | None = None,
) -> ChairmanReport:
    label_of = {m: lab for lab, m in labels.items()}
    result = _call(
        client,
        chairman,
        Stage.CHAIRMAN,
        prefix=prefix,
        prompt=chairman_prompt(
            peer_answers(labels, answers, exclude=None),
            [label_of[m] for m in agg.ranking],
            agg.agreement,
        ),
        verification_id=verification_id,
        timeout_s=timeout_s,
        deadline_at=deadline_at,
    )
    if isinstance(result, ProviderFailure):
        return ChairmanReport(
            model=chairman,
            ok=False,
            error=result,
            timed_out=result.is_timeout,
            verdict_parse="absent",
        )
    return parse_chairman(chairman, result)


def top_ranked_answer(agg: Aggregate, answers: Mapping[str, Stage1Answer]) -> Stage1Answer | None:
    for model in agg.ranking:
        if model in answers and answers[model].ok:
            return answers[model]
    return None


def findings_by_severity(findings: Sequence[Finding]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in findings:
        key = f.effective_severity.value
        counts[key] = counts.get(key, 0) + 1
    return counts
