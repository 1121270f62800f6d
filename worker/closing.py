"""Closing a verification: gather the stage results, finalize once, record the outcome.

Used by the chairman task and by the watchdog, so a payload is always written the same way
(the shared `finalize`, the same transcript files as the embedded runner) and exactly once:
the final payload is computed under the `lease:final` lease and stored with SET NX. A
caller that computed a payload but lost the race rewrites the transcript's result with the
stored payload, so the transcript always matches what every reader gets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from shared import transcript
from shared.models import (
    Aggregate,
    ChairmanReport,
    PeerReview,
    ProviderFailure,
    Stage,
    Stage1Answer,
)
from shared.pipeline import RunPlan, finalize, stage2_assignments, write_outcome
from shared.response import VerifyResponse
from worker.context import Context
from worker.state import RANKS

SKIPPED = "skipped"


def missing_answer(model: str, message: str) -> Stage1Answer:
    failure = ProviderFailure(kind="timeout", message=message)
    return Stage1Answer(model=model, ok=False, error=failure)


def missing_review(reviewer: str, message: str) -> PeerReview:
    return PeerReview(
        reviewer=reviewer, ok=False, error=ProviderFailure(kind="timeout", message=message)
    )


def stored_answers(
    ctx: Context, plan: RunPlan, *, missing: str = "stage 1 ended"
) -> dict[str, Stage1Answer]:
    """Stage-1 answers from the store, in council order; a missing one is a timeout."""
    keys = [ctx.keys.result(plan.verification_id, Stage.STAGE1.value, m) for m in plan.models]
    raws = ctx.client.mget(keys) if keys else []
    return {
        m: Stage1Answer.model_validate_json(raw) if raw else missing_answer(m, missing)
        for m, raw in zip(plan.models, raws, strict=True)
    }


def parse_stage1_results(plan: RunPlan, results: Sequence[str]) -> dict[str, Stage1Answer]:
    """Stage-1 answers from a chord's results, in council order."""
    by_model: dict[str, Stage1Answer] = {}
    for raw in results:
        answer = Stage1Answer.model_validate_json(raw)
        by_model[answer.model] = answer
    return {m: by_model.get(m) or missing_answer(m, "stage 1 ended") for m in plan.models}


def reviews_in_order(
    plan: RunPlan,
    answers: Mapping[str, Stage1Answer],
    given: Mapping[str, PeerReview],
    *,
    missing: str = "stage 2 ended",
) -> list[PeerReview]:
    """One review per stage-2 assignment, in label order (as the embedded runner lists them)."""
    return [given.get(r) or missing_review(r, missing) for r in stage2_assignments(plan, answers)]


def parse_stage2_results(results: Sequence[str]) -> dict[str, PeerReview]:
    out: dict[str, PeerReview] = {}
    for raw in results:
        data = json.loads(raw)
        if SKIPPED in data:
            continue
        review = PeerReview.model_validate(data)
        out[review.reviewer] = review
    return out


def stored_reviews(ctx: Context, plan: RunPlan, reviewers: Sequence[str]) -> dict[str, PeerReview]:
    keys = [ctx.keys.result(plan.verification_id, Stage.STAGE2.value, r) for r in reviewers]
    raws = ctx.client.mget(keys) if keys else []
    return {
        r: PeerReview.model_validate_json(raw)
        for r, raw in zip(reviewers, raws, strict=True)
        if raw
    }


def completed_stages(
    answers: Mapping[str, Stage1Answer], reviews: Sequence[PeerReview], report: ChairmanReport
) -> list[str]:
    done: list[str] = []
    if any(a.ok for a in answers.values()):
        done.append("stage1")
    if "stage1" in done and any(r.ok for r in reviews):
        done.append("stage2")
    if report.ok:
        done.append("chairman")
    return done


def timing_from_state(fields: Mapping[str, str], plan: RunPlan, now: float) -> dict[str, int]:
    def t(name: str) -> float | None:
        value = fields.get(f"t_{name}")
        return float(value) if value else None

    s1 = t("stage1") or plan.created_at
    ch = t("chairman") or now
    s2 = t("stage2") or ch
    return {
        "stage1_ms": max(0, int((s2 - s1) * 1000)),
        "stage2_ms": max(0, int((ch - s2) * 1000)),
        "chairman_ms": max(0, int((now - ch) * 1000)),
        "total_ms": max(0, int((now - plan.created_at) * 1000)),
    }


def stage_files(
    answers: Mapping[str, Stage1Answer],
    reviews: Sequence[PeerReview],
    agg: Aggregate,
    report: ChairmanReport,
) -> dict[str, Any]:
    """The per-stage transcript files, exactly as the embedded runner writes them."""
    return {
        "stage1.json": {m: a.model_dump(mode="json") for m, a in answers.items()},
        "stage2.json": {
            "reviews": [r.model_dump(mode="json") for r in reviews],
            "aggregate": agg.model_dump(mode="json"),
        },
        "chairman.json": report.model_dump(mode="json"),
    }


def finalize_once(
    ctx: Context,
    plan: RunPlan,
    answers: Mapping[str, Stage1Answer],
    reviews: Sequence[PeerReview],
    agg: Aggregate,
    report: ChairmanReport,
    *,
    fired: bool,
    completed: Sequence[str],
) -> VerifyResponse:
    vid = plan.verification_id

    def compute() -> str:
        files = stage_files(answers, reviews, agg, report)
        for name, obj in files.items():
            transcript.write_json(plan.folder, name, obj)
        now = time.time()
        response = finalize(
            plan,
            answers,
            reviews,
            agg,
            report,
            completed_stages=completed,
            fired=fired,
            timing=timing_from_state(ctx.state.raw(vid), plan, now),
            runner="celery",
        )
        pipe = ctx.client.pipeline()
        pipe.incr(ctx.keys.finalized(vid))
        pipe.expire(ctx.keys.finalized(vid), ctx.final_ttl)
        pipe.set(ctx.keys.files(vid), json.dumps(files), ex=ctx.final_ttl)
        pipe.execute()
        return response.model_dump_json()

    outcome = ctx.store.run_once(
        ctx.keys.final(vid), ctx.keys.final_lease(vid), compute, ttl_s=ctx.final_ttl
    )
    payload = VerifyResponse.model_validate_json(outcome.value)
    if outcome.computed and not outcome.won:
        write_outcome(plan.folder, payload)
    record_done(ctx, vid, plan)
    return payload


def record_done(ctx: Context, vid: str, plan: RunPlan | None = None) -> None:
    """Mark the verification done and take it off the watchdog's list."""
    ttl = ctx.record_ttl(plan) if plan is not None else ctx.final_ttl
    ctx.state.advance(vid, "done", ttl)
    pipe = ctx.client.pipeline()
    pipe.zrem(ctx.keys.deadlines, vid)
    pipe.hdel(ctx.keys.plans, vid)
    for key in (ctx.keys.events(vid), ctx.keys.finished(vid)):
        pipe.rpush(key, "done")
        pipe.expire(key, ttl)
    pipe.execute()


def under_way(ctx: Context, plan: RunPlan) -> bool:
    """Did any work happen for this verification (a worker took a task)?"""
    fields = ctx.state.raw(plan.verification_id)
    if not fields:
        return False
    if int(fields.get("rank", "0") or 0) > RANKS["queued"]:
        return True
    return bool(ctx.client.exists(ctx.keys.done(plan.verification_id, "stage1")))
