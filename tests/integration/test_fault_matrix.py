"""Provider faults in every stage: the verdict, unclear reason, retry hint, completed stages
and the number of provider calls. No fault may ever yield a pass that hides missing work."""

from __future__ import annotations

import pytest

from tests.helpers import CLEAN_CODE
from tests.integration.faults import CHAIRMAN, MEMBERS, calls_of, council
from tests.integration.faults import verify_head as _verify_head
from tests.integration.worker_fixtures import CeleryStack

pytestmark = pytest.mark.integration

#: fault -> calls the faulted model receives in its stage (max_attempts = 4)
CALLS = {
    "http429": 4,
    "http500": 4,
    "hang": 1,
    "malformed": 1,
    "truncated": 1,
    "auth401": 1,
    "billing402": 1,
}
KIND = {
    "http429": "rate_limit",
    "http500": "server",
    "hang": "timeout",
    "malformed": "malformed",
    "truncated": "truncated",
    "auth401": "auth",
    "billing402": "billing",
}
FAULTS = sorted(CALLS)
FAST = {"timeout_multiplier": 0.1}  # quick tier: deadline 6 s, per-call cap 2 s


@pytest.fixture
def clean_repo(repo):
    repo.commit("base", {"README.md": "demo\n"})
    repo.commit("add lookup", {"app/db.py": CLEAN_CODE})
    return repo


class RemoteRunner:
    """The Celery runner against a module-wide worker on a private Redis namespace."""

    def __init__(self, stack) -> None:
        self.stack = stack
        self.settings_overrides = {"broker_url": stack.redis_url, "redis_url": stack.redis_url}

    def run(self, plan, settings):
        from worker.runner import run_remote

        return run_remote(plan, settings, options=self.stack.worker_settings())


@pytest.fixture(scope="module")
def fault_stack(redis_url, tmp_path_factory):
    stack = CeleryStack(redis_url=redis_url, workdir=tmp_path_factory.mktemp("faults"))
    try:
        # The same retry policy as the embedded runs (provider_backoff_s=0.02); one worker
        # per tier group, as in production.
        env = {"LLM_COUNCIL_PROVIDER_BACKOFF_S": "0.02"}
        stack.worker("quick,balanced", concurrency=5, name="faults-fast", env=env).start()
        stack.worker("high,reasoning", concurrency=5, name="faults-slow", env=env).start()
        yield stack
    finally:
        stack.close()


@pytest.fixture(params=["embedded", "celery"])
def runner(request):
    if request.param == "celery":
        return RemoteRunner(request.getfixturevalue("fault_stack"))
    return "embedded"


def verify_head(root, runner, **kwargs):
    if isinstance(runner, RemoteRunner):
        return _verify_head(root, "celery", remote=runner, **kwargs)
    return _verify_head(root, runner, **kwargs)


def test_baseline_passes(clean_repo, runner, fake_provider):
    p = verify_head(clean_repo.root, runner, **council(fake_provider.openai_base), **FAST)
    assert (p.verdict, p.exit_code) == ("pass", 0)
    assert p.completed_stages == ("stage1", "stage2", "chairman")
    calls = calls_of(fake_provider, p.verification_id)
    assert all(calls[("stage1", m)] == 1 for m in MEMBERS)
    assert all(calls[("stage2", m)] == 1 for m in MEMBERS)
    assert calls[("chairman", CHAIRMAN)] == 1


@pytest.mark.parametrize("fault", FAULTS)
def test_one_stage1_model_failing_still_passes_with_quorum(
    clean_repo, runner, fake_provider, fault
):
    fake_provider.configure(faults={"careful-1": {"behaviour": fault, "stages": ["stage1"]}})
    p = verify_head(clean_repo.root, runner, **council(fake_provider.openai_base), **FAST)
    assert (p.verdict, p.unclear_reason, p.retry_hint) == ("pass", None, None)
    assert p.completed_stages == ("stage1", "stage2", "chairman")
    failed = p.diagnostics.failed_models
    assert list(failed) == [f"openai-compat@{fake_provider.openai_base}:careful-1"]
    assert next(iter(failed.values())).kind == KIND[fault]
    calls = calls_of(fake_provider, p.verification_id)
    assert calls[("stage1", "careful-1")] == CALLS[fault]
    assert ("stage2", "careful-1") not in calls  # a model that did not answer does not review
    assert p.diagnostics.stage1_answers == 3


@pytest.mark.parametrize("fault", FAULTS)
def test_all_stage1_models_failing_is_infra_failure(clean_repo, runner, fake_provider, fault):
    fake_provider.configure(faults={"*": {"behaviour": fault, "stages": ["stage1"]}})
    p = verify_head(clean_repo.root, runner, **council(fake_provider.openai_base), **FAST)
    assert (p.verdict, p.unclear_reason, p.exit_code) == ("unclear", "infra_failure", 2)
    assert p.retry_hint is None
    assert p.completed_stages == ()
    calls = calls_of(fake_provider, p.verification_id)
    assert all(calls[("stage1", m)] == CALLS[fault] for m in MEMBERS)
    assert not [k for k in calls if k[0] != "stage1"]  # nobody reviewed, no chairman call
    assert KIND[fault] in p.rationale


@pytest.mark.parametrize("fault", FAULTS)
def test_failed_peer_review_blocks_a_pass(clean_repo, runner, fake_provider, fault):
    fake_provider.configure(faults={"*": {"behaviour": fault, "stages": ["stage2"]}})
    p = verify_head(clean_repo.root, runner, **council(fake_provider.openai_base), **FAST)
    assert (p.verdict, p.unclear_reason) == ("unclear", "infra_failure")
    assert p.diagnostics.pass_blocked_by == "deliberation_invalid"
    assert p.completed_stages == ("stage1", "chairman")
    calls = calls_of(fake_provider, p.verification_id)
    assert all(calls[("stage2", m)] == CALLS[fault] for m in MEMBERS)
    assert calls[("chairman", CHAIRMAN)] == 1


@pytest.mark.parametrize("fault", FAULTS)
def test_failed_chairman_falls_back_to_the_top_ranked_member(
    clean_repo, runner, fake_provider, fault
):
    fake_provider.configure(faults={CHAIRMAN: {"behaviour": fault, "stages": ["chairman"]}})
    p = verify_head(clean_repo.root, runner, **council(fake_provider.openai_base), **FAST)
    assert (p.verdict, p.unclear_reason) == ("pass", None)
    assert p.diagnostics.used_fallback_chairman is True
    top = p.diagnostics.aggregate_ranking[0]
    assert p.diagnostics.chairman_model == top
    calls = calls_of(fake_provider, p.verification_id)
    assert calls[("chairman", CHAIRMAN)] == CALLS[fault]
    assert calls[("chairman", top.rsplit(":", 1)[1])] == 1


@pytest.mark.parametrize("fault", FAULTS)
def test_failed_chairman_without_fallback_is_unclear(clean_repo, runner, fake_provider, fault):
    fake_provider.configure(faults={CHAIRMAN: {"behaviour": fault, "stages": ["chairman"]}})
    p = verify_head(
        clean_repo.root,
        runner,
        **council(fake_provider.openai_base),
        **FAST,
        fallback_chairman="none",
    )
    assert (p.verdict, p.unclear_reason, p.exit_code) == ("unclear", "infra_failure", 2)
    assert p.completed_stages == ("stage1", "stage2")
    assert p.diagnostics.chairman_error is not None
    assert p.diagnostics.chairman_error.kind == KIND[fault]
    if fault == "hang":  # the chairman's own call cap fired: starvation, so retry up
        assert p.retry_hint is not None
        assert (p.retry_hint.reason, p.retry_hint.suggested_tier) == (
            "synthesis_starved",
            "balanced",
        )
        assert p.timeout_fired is False
    else:
        assert p.retry_hint is None
    # peer review finished, so its scores and agreement are salvaged
    assert p.diagnostics.deliberation_agreement is not None
    assert p.rubric_scores.accuracy is not None
    assert calls_of(fake_provider, p.verification_id)[("chairman", CHAIRMAN)] == CALLS[fault]


def test_unreachable_model_counts_as_connection_failure(clean_repo, runner, fake_provider):
    base = fake_provider.openai_base
    models = [f"openai-compat@{base}:{m}" for m in MEMBERS[:3]]
    models.append("openai-compat@http://127.0.0.1:9/v1:careful-4")
    p = verify_head(
        clean_repo.root,
        runner,
        models=models,
        chairman=f"openai-compat@{base}:{CHAIRMAN}",
        **FAST,
    )
    assert p.verdict == "pass"
    assert p.diagnostics.failed_models["openai-compat@http://127.0.0.1:9/v1:careful-4"].kind == (
        "connection"
    )


def test_deadline_at_reasoning_suggests_reducing_scope(clean_repo, runner, fake_provider):
    fake_provider.configure(faults={CHAIRMAN: {"behaviour": "hang", "stages": ["chairman"]}})
    p = verify_head(
        clean_repo.root,
        runner,
        tier="reasoning",
        **council(fake_provider.openai_base),
        timeout_multiplier=0.005,  # reasoning: deadline 6 s
        per_call_caps={"reasoning": 100_000},  # so the deadline, not the cap, ends the call
        fallback_chairman="none",
    )
    assert (p.verdict, p.unclear_reason) == ("unclear", "timeout")
    assert p.timeout_fired and p.partial
    assert p.completed_stages == ("stage1", "stage2")
    assert p.retry_hint is not None
    assert (p.retry_hint.action, p.retry_hint.suggested_tier) == ("reduce_scope", None)
    assert p.retry_hint.reason == "synthesis_starved"


def test_deadline_during_peer_review_is_deadline_exhausted(clean_repo, runner, fake_provider):
    fake_provider.configure(faults={"*": {"behaviour": "hang", "stages": ["stage2", "chairman"]}})
    p = verify_head(
        clean_repo.root,
        runner,
        **council(fake_provider.openai_base),
        timeout_multiplier=0.1,
        per_call_caps={"quick": 1000},
        fallback_chairman="none",
    )
    assert (p.verdict, p.unclear_reason) == ("unclear", "timeout")
    assert p.completed_stages == ("stage1",)
    assert p.retry_hint is not None
    assert (p.retry_hint.reason, p.retry_hint.suggested_tier) == ("deadline_exhausted", "balanced")


def test_slow_stage1_leaves_the_chairman_its_reserve(clean_repo, runner, fake_provider):
    p = verify_head(
        clean_repo.root,
        runner,
        **council(
            fake_provider.openai_base,
            members=("careful-1", "careful-2", "hang"),
            chairman="slow-1200",
        ),
        timeout_multiplier=0.1,  # deadline 6 s: the chairman's reserve is 1.8 s
        per_call_caps={"quick": 1000},  # stage 1 is bounded by its own end, not a cap
    )
    assert (p.verdict, p.unclear_reason) == ("pass", None), p.rationale
    assert p.timing is not None
    assert p.timing["chairman_ms"] >= 1200
    assert (
        p.diagnostics.failed_models[f"openai-compat@{fake_provider.openai_base}:hang"].kind
        == "timeout"
    )


def test_chairman_disabled_is_never_a_pass(clean_repo, runner, fake_provider):
    p = verify_head(
        clean_repo.root,
        runner,
        **council(fake_provider.openai_base),
        **FAST,
        chairman_disabled=True,
    )
    assert (p.verdict, p.unclear_reason, p.exit_code) == ("unclear", "chairman_disabled", 2)
    assert p.diagnostics.verdict_source == "chairman_disabled"
    assert p.diagnostics.findings_source == "skipped"
    assert p.rationale  # the top-ranked peer answer, for reference only
    calls = calls_of(fake_provider, p.verification_id)
    assert not [k for k in calls if k[0] == "chairman"]
    assert all(calls[("stage2", m)] == 1 for m in MEMBERS)
