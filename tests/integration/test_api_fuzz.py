"""Fuzzing from the app's own OpenAPI schema (schemathesis, in-process over ASGI): no
generated input, valid or invalid, gets a 5xx. The council behind it is the fake provider, so
a generated request that happens to be valid runs a real (fast) verification."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

from api.app import create_app
from shared.settings import CouncilSettings
from tests.helpers import SQL_INJECTION, GitRepo

pytestmark = pytest.mark.integration

MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")
#: Examples per operation and mode: 7 operations x 2 modes x this stays well under a minute.
EXAMPLES = 25


@pytest.fixture
def app(tmp_path: Path, monkeypatch, fake_provider):
    monkeypatch.chdir(tmp_path)
    roots = tmp_path / "roots"
    repo = GitRepo(roots / "proj")
    repo.commit("init", {"db.py": SQL_INJECTION})
    base = fake_provider.openai_base
    council = CouncilSettings(
        models=[f"openai-compat@{base}:{m}" for m in MEMBERS],
        chairman=f"openai-compat@{base}:careful-chair",
        repo_roots=[str(roots)],
    )
    application = create_app(council, base_dir=tmp_path, max_body_bytes=64 * 1024)
    application.state.fixture_repo = repo
    yield application
    application.state.service.close()


def test_no_generated_input_gets_a_server_error(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/v1/council/verify",
        "/v1/council/verifications",
        "/v1/council/verifications/{verification_id}",
        "/v1/council/verifications/{verification_id}/transcript",
        "/healthz",
    }
    failures: list[str] = []
    fuzzed = set()
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzz(op, mode, failures)
            except Unsatisfiable:  # nothing invalid to generate (an operation with no input)
                continue
            fuzzed.add((op.method.upper(), op.path, mode.value))
    assert not failures, "\n\n".join(failures[:5])
    assert ("POST", "/v1/council/verify", "negative") in fuzzed
    assert ("GET", "/v1/council/verifications", "negative") in fuzzed


def fuzz(op, mode: GenerationMode, failures: list[str]) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case) -> None:
        response = case.call()
        if response.status_code >= 500:
            failures.append(
                f"{op.method.upper()} {op.path} ({mode.value}) -> {response.status_code}: "
                f"{case.as_curl_command()}\n{response.text[:500]}"
            )

    run()


# Schema-shaped fuzzing rarely gets past "exactly one of repo and bundle"; these strategies
# aim at the paths behind it: inline bundles and a real repository with hostile arguments.

GOOD_PATHS = st.sampled_from(["a.py", "src/app.py", "db.py", "docs/readme.md", "tool.sh", "x"])
HOSTILE_PARTS = st.sampled_from(
    ["a", "src", "..", ".", "", ".env", ".ENV.local", "id_rsa", "x.py", "db.py", "C:", "~",
     "node_modules", "package-lock.json", "dir/", "\u00e9", "a\tb", "\x00", "\n", " "]
)  # fmt: skip
HOSTILE_PATHS = st.lists(HOSTILE_PARTS, min_size=1, max_size=4).map("/".join) | st.text(max_size=30)
#: Mostly well-formed paths, so that many requests get past validation and run the council.
PATHS = st.one_of(GOOD_PATHS, GOOD_PATHS, GOOD_PATHS, HOSTILE_PATHS)
TEXT = st.text(max_size=200)
COMMON = {
    "tier": st.sampled_from([None, "quick", "balanced", "high", "reasoning"]),
    "rubric_focus": st.lists(st.text(max_size=20), max_size=3),
    "confidence_threshold": st.none() | st.floats(min_value=0, max_value=1),
    "target_paths": st.one_of(st.none(), st.none(), st.lists(PATHS, max_size=3)),
    "wait": st.booleans(),
}


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


BUNDLE_BODIES = st.fixed_dictionaries(
    {
        "snapshot_id": st.one_of(
            st.sampled_from(["HEAD", "abc123", "deadbeef" * 5]),
            st.sampled_from(["HEAD", "abc123"]),
            st.text(max_size=12),
        ),
        "bundle": st.fixed_dictionaries(
            {
                "files": st.lists(
                    st.fixed_dictionaries(
                        {"path": PATHS, "content": TEXT, "executable": st.booleans()}
                    ),
                    min_size=1,
                    max_size=5,
                )
            }
        ),
        **COMMON,
    }
).map(_drop_none)


def repo_bodies(repo: str) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries(
        {
            "repo": st.sampled_from([repo, repo + "/..", repo + "/.git", "proj", "../proj"]),
            "snapshot_id": st.one_of(
                st.sampled_from(["HEAD", "main"]),
                st.sampled_from(["HEAD", "HEAD~5", "-x", "HEAD^{tree}", "main"]),
                st.text(max_size=12),
            ),
            **COMMON,
        }
    ).map(_drop_none)


def test_hostile_bundles_and_repository_requests_get_no_server_error(app):
    from fastapi.testclient import TestClient

    client = TestClient(app)
    statuses: dict[int, int] = {}

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(body=BUNDLE_BODIES | repo_bodies(str(app.state.fixture_repo.root)))
    def run(body: dict) -> None:
        r = client.post("/v1/council/verify", json=body)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (body, r.text[:500])
        assert r.status_code in (200, 202, 422), (body, r.status_code, r.text[:300])
        if r.status_code == 200:
            assert r.json()["verdict"] in ("pass", "fail", "unclear")

    run()
    assert statuses.get(200, 0) + statuses.get(202, 0) >= 5, statuses
    assert statuses.get(422, 0) >= 5, statuses
