"""The embedded runner: the whole council in-process, each stage's calls concurrent.

Used when no broker is configured. It calls the same stage functions and the same
`finalize` as the Celery runner, so both give the same payload for the same subject.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from shared import transcript
from shared.models import (
    Aggregate,
    ChairmanReport,
    PeerReview,
    ProviderFailure,
    Stage,
    Stage1Answer,
)
from shared.pipeline import (
    RunPlan,
    deadline_fired,
    finalize,
    labels_for,
    stage2_assignments,
    synthesise,
)
from shared.providers.base import ProviderClient
from shared.response import VerifyResponse
from shared.stages import aggregate, run_stage1, run_stage2

ProgressFn = Callable[[str, int, int], None]
T = TypeVar("T")

#: Waiting on a stage's futures stops this long after the stage's end; calls have their own
#: timeouts, this only guards against a client that ignores them.
STAGE_GRACE_S = 2.0


def _noop(stage: str, done: int, total: int) -> None:
    return None


def _gather(
    pool: ThreadPoolExecutor,
    jobs: dict[str, Callable[[], T]],
    until: float,
    on_missing: Callable[[str], T],
    progress: Callable[[int, int], None],
) -> dict[str, T]:
    futures: dict[Future[T], str] = {pool.submit(fn): key for key, fn in jobs.items()}
    results: dict[str, T] = {}
    pending = set(futures)
    progress(0, len(jobs))
    while pending:
        done, pending = wait(
            pending, timeout=max(0.0, until - time.time()), return_when="FIRST_COMPLETED"
        )
        if not done:
            break
        for fut in done:
            results[futures[fut]] = fut.result()
        progress(len(results), len(jobs))
    for fut in pending:
        results[futures[fut]] = on_missing(futures[fut])
    return {key: results[key] for key in jobs}


def run_embedded(
    plan: RunPlan, client: ProviderClient, *, on_progress: ProgressFn = _noop
) -> VerifyResponse:
    t0 = time.time()
    timing: dict[str, int] = {}
    if plan.input_error is not None:
        return finalize(plan, {}, [], None, None, completed_stages=(), fired=False, timing=timing)

    budget = plan.budget
    completed: list[str] = []
    with ThreadPoolExecutor(max_workers=max(4, len(plan.models))) as pool:
        start = time.time()
        answers = _gather(
            pool,
            {
                m: (
                    lambda m=m: run_stage1(  # type: ignore[misc]
                        client,
                        m,
                        prefix=plan.prefix,
                        verification_id=plan.verification_id,
                        timeout_s=budget.call_timeout(Stage.STAGE1, time.time()),
                        deadline_at=plan.stage1_end,
                    )
                )
                for m in plan.models
            },
            plan.stage1_end + STAGE_GRACE_S,
            lambda m: Stage1Answer(
                model=m, ok=False, error=ProviderFailure(kind="timeout", message="stage 1 ended")
            ),
            lambda d, n: on_progress("stage1", d, n),
        )
        timing["stage1_ms"] = int((time.time() - start) * 1000)
        transcript.write_json(plan.folder, "stage1.json", answers)
        if any(a.ok for a in answers.values()):
            completed.append("stage1")

        start = time.time()
        assignments = stage2_assignments(plan, answers)
        reviews_by = _gather(
            pool,
            {
                r: (
                    lambda r=r, shown=shown: run_stage2(  # type: ignore[misc]
                        client,
                        r,
                        prefix=plan.prefix,
                        shown=shown,
                        verification_id=plan.verification_id,
                        timeout_s=budget.call_timeout(Stage.STAGE2, time.time()),
                        deadline_at=plan.stage2_end,
                    )
                )
                for r, shown in assignments.items()
            },
            plan.stage2_end + STAGE_GRACE_S,
            lambda r: PeerReview(
                reviewer=r, ok=False, error=ProviderFailure(kind="timeout", message="stage 2 ended")
            ),
            lambda d, n: on_progress("stage2", d, n),
        )
        reviews = list(reviews_by.values())
        agg: Aggregate = aggregate(labels_for(plan, answers), reviews, plan.seed)
        timing["stage2_ms"] = int((time.time() - start) * 1000)
        transcript.write_json(plan.folder, "stage2.json", {"reviews": reviews, "aggregate": agg})
        if "stage1" in completed and any(r.ok for r in reviews):
            completed.append("stage2")

    start = time.time()
    on_progress("chairman", 0, 1)
    report: ChairmanReport = synthesise(plan, client, answers, agg)
    on_progress("chairman", 1, 1)
    timing["chairman_ms"] = int((time.time() - start) * 1000)
    transcript.write_json(plan.folder, "chairman.json", report)
    if report.ok:
        completed.append("chairman")
    timing["total_ms"] = int((time.time() - t0) * 1000)
    return finalize(
        plan,
        answers,
        reviews,
        agg,
        report,
        completed_stages=completed,
        fired=deadline_fired(plan, report),
        timing=timing,
    )
