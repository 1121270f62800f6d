"""The council through real Celery workers, real Redis and the fake provider over HTTP."""

from __future__ import annotations

import json
import time

import pytest

from shared import transcript
from shared.embedded import run_embedded
from shared.providers.client import HttpProviderClient, ProviderKeys
from tests.helpers import CLEAN_CODE, SQL_INJECTION
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    calls_by_key,
    commit_change,
    make_plan,
    plan_for,
    wait_until,
)
from worker.runner import get_state, run_remote, submit_remote
from worker.tasks import SOFT_LIMIT_MESSAGE

pytestmark = pytest.mark.integration
shared_stack = worker_fixtures.shared_stack  # the fixture, for this module's tests

IGNORED = {"verification_id", "transcript_location", "timing", "runner"}


def test_full_verification_through_celery(shared_stack, fake_provider, repo):
    settings = shared_stack.settings(fake_provider)
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    seen: list[tuple[str, int, int]] = []
    payload = run_remote(
        plan,
        settings,
        on_progress=lambda s, d, n: seen.append((s, d, n)),
        options=shared_stack.worker_settings(),
    )
    assert payload.runner == "celery"
    assert (payload.verdict.value, payload.exit_code) == ("fail", 1)
    assert payload.blocking_issues[0].location == "app/db.py:6"
    assert payload.completed_stages == ("stage1", "stage2", "chairman")
    # Progress: every stage reported, ending complete.
    assert ("stage1", 4, 4) in seen and ("stage2", 4, 4) in seen and ("chairman", 1, 1) in seen
    assert [s for s, _, _ in seen] == sorted(
        (s for s, _, _ in seen), key=["stage1", "stage2", "chairman"].index
    )
    # One call per (stage, model), each completed once.
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert len([k for k in calls if k[0] == "stage1"]) == 4
    assert len([k for k in calls if k[0] == "stage2"]) == 4
    assert all(v == {"calls": 1, "completed": 1} for v in calls.values()), calls
    # The transcript is complete, sealed, and holds the same payload.
    folder = plan.folder
    assert {
        "request.json",
        "stage1.json",
        "stage2.json",
        "chairman.json",
        "result.json",
        "integrity.json",
    } <= {p.name for p in folder.iterdir()}
    assert transcript.validate(folder) == []
    assert json.loads((folder / "result.json").read_text())["verification_id"] == (
        plan.verification_id
    )
    # State readable by id, done, with counts.
    state = get_state(plan.verification_id, settings, options=shared_stack.worker_settings())
    assert state is not None and state.state == "done" and state.payload == payload
    assert (state.stage1.done, state.stage1.total) == (4, 4)
    assert (state.stage2.done, state.stage2.total) == (4, 4)
    assert (state.chairman.done, state.chairman.total) == (1, 1)
    ctx = shared_stack.context(settings)
    assert int(ctx.client.get(ctx.keys.finalized(plan.verification_id))) == 1


def test_parity_with_the_embedded_runner(shared_stack, fake_provider, repo):
    settings = shared_stack.settings(fake_provider)
    sha = commit_change(repo, SQL_INJECTION)
    plan_c = plan_for(repo, settings, sha, seed=1234)
    fake_provider.reset()
    remote = run_remote(plan_c, settings, options=shared_stack.worker_settings())
    plan_e = plan_for(repo, settings, sha, seed=1234)
    fake_provider.reset()  # same prompt-cache state for both runs
    embedded = run_embedded(plan_e, HttpProviderClient(ProviderKeys.from_settings(settings)))
    a = remote.model_dump(mode="json", exclude=IGNORED)
    b = embedded.model_dump(mode="json", exclude=IGNORED)
    assert a == b
    assert (remote.runner, embedded.runner) == ("celery", "embedded")
    # The stage transcripts agree too (apart from measured latencies).
    for name in ("stage1.json", "stage2.json", "chairman.json"):
        c = _without_latency(json.loads((plan_c.folder / name).read_text()))
        e = _without_latency(json.loads((plan_e.folder / name).read_text()))
        assert c == e, name


def _without_latency(obj):
    if isinstance(obj, dict):
        return {k: _without_latency(v) for k, v in obj.items() if k != "latency_ms"}
    if isinstance(obj, list):
        return [_without_latency(v) for v in obj]
    return obj


def test_clean_change_passes_and_state_progresses(shared_stack, fake_provider, repo):
    settings = shared_stack.settings(fake_provider)
    plan = make_plan(repo, settings, content=CLEAN_CODE)
    ws = shared_stack.worker_settings()
    submit_remote(plan, settings, options=ws)
    first = get_state(plan.verification_id, settings, options=ws)
    assert first is not None and first.state in ("queued", "stage1", "stage2", "chairman", "done")
    state = wait_until(
        lambda: (s := get_state(plan.verification_id, settings, options=ws)) and s.payload and s,
        30,
        "the payload",
    )
    assert state.state == "done"
    assert (state.payload.verdict.value, state.payload.exit_code) == ("pass", 0)


def test_a_task_delivered_twice_concurrently_calls_the_provider_once(
    shared_stack, fake_provider, repo
):
    from worker.celery_app import get_app
    from worker.config import group_of, queue_name

    members = ("slow-800", "careful-2", "careful-3", "lenient-1")
    settings = shared_stack.settings(fake_provider, members=members)
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    ctx = shared_stack.context(settings)
    ctx.client.set(ctx.keys.plan(plan.verification_id), plan.model_dump_json(), ex=600)
    app = get_app(group_of(plan.tier), settings, shared_stack.worker_settings())
    args = (plan.verification_id, plan.models[0], plan.deadline_at)
    first = app.send_task("council.stage1", args=args, queue=queue_name(plan.tier))
    second = app.send_task("council.stage1", args=args, queue=queue_name(plan.tier))
    wait_until(lambda: first.ready() and second.ready(), 30, "both copies to finish")
    a, b = first.result, second.result
    assert a == b and json.loads(a)["ok"] is True
    calls = calls_by_key(fake_provider, plan.verification_id)
    assert calls == {("stage1", "slow-800"): {"calls": 1, "completed": 1}}


def test_chairman_soft_time_limit_gives_a_partial_timeout_payload(
    shared_stack, fake_provider, repo
):
    # quick x 0.1: a 6 s verification; the per-call cap is raised above it so the hanging
    # chairman's own HTTP timeout cannot fire first: the soft time limit must end it.
    settings = shared_stack.settings(
        fake_provider, chairman="hang", timeout_multiplier=0.1, per_call_caps={"quick": 100.0}
    )
    plan = make_plan(repo, settings, content=SQL_INJECTION)
    t0 = time.time()
    payload = run_remote(plan, settings, options=shared_stack.worker_settings())
    took = time.time() - t0
    assert payload.verdict.value == "unclear"
    assert payload.unclear_reason is not None and payload.unclear_reason.value == "timeout"
    assert payload.timeout_fired and payload.partial
    assert payload.completed_stages == ("stage1", "stage2")
    assert payload.retry_hint is not None and payload.retry_hint.reason == "synthesis_starved"
    assert payload.diagnostics.chairman_error is not None
    assert payload.diagnostics.chairman_error.message == SOFT_LIMIT_MESSAGE
    # Written by the deadline (plus the time it takes to write it), not after a grace.
    assert time.time() - t0 >= 0 and plan.deadline_at - 0.3 <= t0 + took <= plan.deadline_at + 2.0
    assert transcript.validate(plan.folder) == []


def test_nothing_to_review_is_closed_by_the_runner_without_a_task(
    shared_stack, fake_provider, repo
):
    repo.commit("base", {"README.md": "demo\n"})
    sha = repo.commit("secrets only", {".env": "TOKEN=abc\n"})
    settings = shared_stack.settings(fake_provider)
    plan = plan_for(repo, settings, sha)
    assert plan.input_error == "no_reviewable_content"
    payload = run_remote(plan, settings, options=shared_stack.worker_settings())
    assert (payload.exit_code, payload.error, payload.runner) == (3, "no_reviewable_content",
                                                                  "celery")  # fmt: skip
    assert fake_provider.calls(verification=plan.verification_id) == []
    state = get_state(plan.verification_id, settings, options=shared_stack.worker_settings())
    assert state is not None and state.state == "done" and state.payload == payload
