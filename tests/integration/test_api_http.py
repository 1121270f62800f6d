"""The HTTP API end to end on the embedded runner: real git repositories, the fake provider
over real HTTP, the app in-process (ASGI), SQLite under the test's own directory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from shared.settings import CouncilSettings
from tests.helpers import CLEAN_CODE, SQL_INJECTION, GitRepo

pytestmark = pytest.mark.integration

MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")
TOKEN = "s3cret-token-for-tests"
CANARY = "CANARY-7f3e9b1c-never-leaves"


def council(fake, members=MEMBERS, chairman="careful-chair", **kw) -> CouncilSettings:
    base = fake.openai_base
    return CouncilSettings(
        models=[f"openai-compat@{base}:{m}" for m in members],
        chairman=f"openai-compat@{base}:{chairman}",
        **kw,
    )


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "roots"
    root.mkdir()
    return root


@pytest.fixture
def proj(roots: Path) -> GitRepo:
    repo = GitRepo(roots / "proj")
    repo.commit("init", {"app.py": CLEAN_CODE})
    return repo


@pytest.fixture
def make_client(tmp_path, roots, monkeypatch, fake_provider):
    monkeypatch.chdir(tmp_path)
    opened: list[TestClient] = []

    def make(*, max_body_bytes: int = 4 * 1024 * 1024, members=MEMBERS, **kw) -> TestClient:
        kw.setdefault("repo_roots", [str(roots)])
        settings = council(fake_provider, members=members, **kw)
        client = TestClient(create_app(settings, base_dir=tmp_path, max_body_bytes=max_body_bytes))
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def poll_done(client: TestClient, vid: str, timeout: float = 30, **kw) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        body = client.get(f"/v1/council/verifications/{vid}", **kw).json()
        if body["state"] in ("done", "error"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"{vid} not done in {timeout}s")


# Sync and async flows ------------------------------------------------------------------


def test_sync_fail_is_a_200_with_the_verdict(make_client, proj):
    client = make_client()
    sha = proj.commit("add query", {"db.py": SQL_INJECTION})
    r = client.post("/v1/council/verify", json={"repo": str(proj.root), "snapshot_id": sha})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["verdict"] == "fail" and body["exit_code"] == 1
    assert body["blocking_issues"], body
    assert body["coverage"]["reviewed"] == ["db.py"]
    assert body["snapshot"]["resolved"] == sha
    assert Path(body["transcript_location"]).is_dir()
    # The stored record is the same payload.
    status = client.get(f"/v1/council/verifications/{body['verification_id']}").json()
    assert status["state"] == "done" and status["verdict"] == "fail"
    assert status["payload"] == body
    assert status["source"] == "api" and status["runner"] == "embedded"


def test_sync_pass_on_clean_code(make_client, proj):
    client = make_client()
    sha = proj.commit("clean", {"users.py": CLEAN_CODE})
    r = client.post(
        "/v1/council/verify",
        json={"repo": "proj", "snapshot_id": sha, "tier": "quick", "rubric_focus": ["Security"]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["verdict"] == "pass" and r.json()["tier"] == "quick"


def test_async_flow_answers_202_then_the_payload(make_client, proj, fake_provider):
    fake_provider.configure(latency_ms=150)
    client = make_client()
    sha = proj.commit("add query", {"db.py": SQL_INJECTION})
    r = client.post(
        "/v1/council/verify", json={"repo": str(proj.root), "snapshot_id": sha, "wait": False}
    )
    assert r.status_code == 202, r.text
    accepted = r.json()
    vid = accepted["verification_id"]
    assert r.headers["location"] == accepted["status_url"] == f"/v1/council/verifications/{vid}"
    assert accepted["verify_deadline_s"] == 180.0
    seen = set()
    end = time.time() + 30
    while time.time() < end:
        st = client.get(accepted["status_url"]).json()
        seen.add(st["state"])
        if st["state"] == "done":
            break
        assert st["payload"] is None
        assert set(st["progress"]) == {"stage1", "stage2", "chairman"}
        time.sleep(0.03)
    assert st["state"] == "done", st
    assert seen & {"queued", "stage1", "stage2", "chairman"}, seen
    assert st["payload"]["verdict"] == "fail"

    tr = client.get(accepted["transcript_url"], params={"validate": "true"}).json()
    names = {f["name"] for f in tr["files"]}
    assert {"request.json", "result.json", "integrity.json", "stage1.json"} <= names
    assert tr["integrity"] == {"checked": True, "ok": True, "problems": []}
    result = next(f for f in tr["files"] if f["name"] == "result.json")["content"]
    assert result == st["payload"]


def test_query_wait_false_overrides_the_body(make_client):
    client = make_client()
    r = client.post(
        "/v1/council/verify?wait=false",
        json={"bundle": {"files": [{"path": "a.py", "content": CLEAN_CODE}]}, "wait": True},
    )
    assert r.status_code == 202
    assert poll_done(client, r.json()["verification_id"])["verdict"] == "pass"


# Listing --------------------------------------------------------------------------------


def test_listing_filters_and_pages(make_client, proj):
    client = make_client()
    bad = proj.commit("add query", {"db.py": SQL_INJECTION})
    good = proj.commit("clean", {"users.py": CLEAN_CODE})
    ids = {}
    for name, sha, tier in (("bad", bad, "balanced"), ("good", good, "quick"), ("g2", good, None)):
        body = {"repo": str(proj.root), "snapshot_id": sha}
        if tier:
            body["tier"] = tier
        r = client.post("/v1/council/verify", json=body)
        assert r.status_code == 200, r.text
        ids[name] = r.json()["verification_id"]

    page = client.get("/v1/council/verifications").json()
    assert page["total"] == 3 and page["next_offset"] is None
    assert [i["verification_id"] for i in page["items"]] == [ids["g2"], ids["good"], ids["bad"]]

    def listed(**params) -> set[str]:
        r = client.get("/v1/council/verifications", params=params)
        assert r.status_code == 200, r.text
        return {i["verification_id"] for i in r.json()["items"]}

    assert listed(verdict="fail") == {ids["bad"]}
    assert listed(verdict="pass", tier="quick") == {ids["good"]}
    assert listed(snapshot=good[:8]) == {ids["good"], ids["g2"]}
    assert listed(snapshot=bad) == {ids["bad"]}
    assert listed(since="2999-01-01T00:00:00Z") == set()
    assert listed(until="2000-01-01T00:00:00+02:00") == set()
    assert len(listed(since="2000-01-01T00:00:00")) == 3

    first = client.get("/v1/council/verifications", params={"limit": 2}).json()
    assert len(first["items"]) == 2 and first["next_offset"] == 2
    rest = client.get("/v1/council/verifications", params={"limit": 2, "offset": 2}).json()
    assert [i["verification_id"] for i in rest["items"]] == [ids["bad"]]
    assert rest["next_offset"] is None

    assert client.get("/v1/council/verifications", params={"tier": "huge"}).status_code == 422
    assert client.get("/v1/council/verifications", params={"limit": 0}).status_code == 422


def test_gate_runs_appear_in_the_list(make_client, proj, fake_provider, monkeypatch):
    """`llm-council gate` writes no database row; its transcript is indexed on the next look."""
    from api.gate import run_gate

    base = fake_provider.openai_base
    monkeypatch.setenv("LLM_COUNCIL_MODELS", ",".join(f"openai-compat@{base}:{m}" for m in MEMBERS))
    monkeypatch.setenv("LLM_COUNCIL_CHAIRMAN", f"openai-compat@{base}:careful-chair")
    sha = proj.commit("add query", {"db.py": SQL_INJECTION})
    code = run_gate(
        snapshot=sha,
        file_paths=None,
        tier="quick",
        rubric_focus=[],
        confidence_threshold=None,
        output_format="json",
        repo=proj.root,
        offline=False,
    )
    assert code == 1
    client = make_client()
    items = client.get("/v1/council/verifications").json()["items"]
    assert len(items) == 1
    item = items[0]
    assert item["source"] == "transcript" and item["verdict"] == "fail"
    assert item["snapshot_resolved"] == sha and item["tier"] == "quick"
    st = client.get(item["status_url"]).json()
    assert st["payload"]["verdict"] == "fail"


# Auth ---------------------------------------------------------------------------------


def test_auth_off_needs_no_token(make_client):
    client = make_client()
    assert client.get("/v1/council/verifications").status_code == 200
    assert client.get("/metrics").status_code == 200


def test_auth_on_every_endpoint_but_healthz(make_client):
    client = make_client(api_token=TOKEN)
    good = {"Authorization": f"Bearer {TOKEN}"}
    checks = [
        ("get", "/v1/council/verifications", None),
        ("get", "/v1/council/verifications/abc", None),
        ("get", "/v1/council/verifications/abc/transcript", None),
        ("post", "/v1/council/verify", {"bundle": {"files": [{"path": "a.py", "content": "x"}]}}),
        ("post", "/v1/council/verify", "not json"),
        ("get", "/metrics", None),
        ("get", "/openapi.json", None),
        ("get", "/docs", None),
    ]
    for method, path, body in checks:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": "Bearer"},
            {"Authorization": f"Bearer {TOKEN}x"},
        ):
            kwargs = {"headers": headers}
            if isinstance(body, dict):
                kwargs["json"] = body
            elif body is not None:
                kwargs["content"] = body
            r = getattr(client, method)(path, **kwargs)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert r.headers["www-authenticate"] == "Bearer"
    assert client.get("/healthz").status_code == 200
    assert client.get("/v1/council/verifications", headers=good).status_code == 200
    assert (
        client.get("/v1/council/verifications", headers={"authorization": f"bearer {TOKEN}"})
    ).status_code == 200
    assert client.get("/metrics", headers=good).status_code == 200
    r = client.post(
        "/v1/council/verify",
        json={"bundle": {"files": [{"path": "a.py", "content": CLEAN_CODE}]}},
        headers=good,
    )
    assert r.status_code == 200 and r.json()["verdict"] == "pass"
    schema = client.get("/openapi.json", headers=good).json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


# Bad input ------------------------------------------------------------------------------


def test_bad_input_statuses(make_client, proj, roots, tmp_path):
    client = make_client()
    sha = proj.commit("add query", {"db.py": SQL_INJECTION})
    repo = str(proj.root)

    def post(body=None, **kw):
        return client.post("/v1/council/verify", json=body, **kw)

    r = client.post(
        "/v1/council/verify", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422

    r = post({"repo": repo, "tier": "enormous"})
    assert r.status_code == 422 and r.json()["field"] == "tier"

    r = post({"snapshot_id": sha})
    assert r.status_code == 422 and "exactly one of" in r.json()["detail"]

    r = post({"repo": repo, "snapshot_id": "no-such-rev"})
    assert r.status_code == 422 and r.json()["field"] == "snapshot_id"

    blob = proj.git("rev-parse", f"{sha}:db.py")  # an object that is not a commit
    r = post({"repo": repo, "snapshot_id": blob})
    assert r.status_code == 422 and r.json()["field"] == "snapshot_id"

    r = post({"repo": repo, "snapshot_id": "--output=/tmp/x"})
    assert r.status_code == 422

    r = post({"repo": repo, "confidence_threshold": 2})
    assert r.status_code == 422 and r.json()["field"] == "confidence_threshold"

    r = post({"repo": repo, "unknown_field": 1})
    assert r.status_code == 422 and r.json()["field"] == "unknown_field"

    r = post({"repo": repo, "target_paths": [123]})
    assert r.status_code == 422 and r.json()["field"].startswith("target_paths")

    for path in ("../roots/proj/app.py", "src/../../etc/passwd", "/etc/passwd", "C:/x"):
        r = post({"repo": repo, "snapshot_id": sha, "target_paths": [path]})
        assert r.status_code == 422, (path, r.text)
        assert r.json()["field"] == "target_paths[0]", r.json()

    for bad_repo in ("/etc", str(tmp_path), "../", str(roots / "missing"), "/"):
        r = post({"repo": bad_repo})
        assert r.status_code == 422 and r.json()["field"] == "repo", (bad_repo, r.text)

    # A symbolic link inside the roots that points outside them.
    outside = GitRepo(tmp_path / "outside")
    outside.commit("init", {"x.py": "print(1)\n"})
    (roots / "sneaky").symlink_to(outside.root)
    r = post({"repo": str(roots / "sneaky")})
    assert r.status_code == 422 and "outside the allowed roots" in r.json()["detail"]

    for vid in ("0" * 32, "nope", "a" * 300, "..", "x%00y"):
        assert client.get(f"/v1/council/verifications/{vid}").status_code == 404, vid
        assert client.get(f"/v1/council/verifications/{vid}/transcript").status_code == 404


def test_symlinks_in_the_commit_that_leave_the_repository_are_refused(make_client, proj):
    client = make_client()
    os.symlink("/etc/passwd", proj.root / "passwd")
    os.symlink("/etc", proj.root / "etcdir")
    os.symlink("../../..", proj.root / "up")
    os.symlink("app.py", proj.root / "inside")
    sha = proj.commit("links")
    for path, needle in (
        ("passwd", "pointing outside"),
        ("up", "pointing outside"),
        ("etcdir/passwd", "goes through the symbolic link"),
        ("up/etc/hosts", "goes through the symbolic link"),
    ):
        r = client.post(
            "/v1/council/verify",
            json={"repo": str(proj.root), "snapshot_id": sha, "target_paths": [path]},
        )
        assert r.status_code == 422, (path, r.text)
        assert needle in r.json()["detail"], r.json()
    # A link that stays inside the repository is reviewed as its link text.
    r = client.post(
        "/v1/council/verify",
        json={"repo": str(proj.root), "snapshot_id": sha, "target_paths": ["inside"]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["coverage"]["reviewed"] == ["inside"]


def test_body_over_the_limit_is_413(make_client):
    client = make_client(max_body_bytes=10_000)
    big = {"bundle": {"files": [{"path": "a.py", "content": "x" * 20_000}]}}
    r = client.post("/v1/council/verify", json=big)
    assert r.status_code == 413

    def chunks():
        for _ in range(30):
            yield b" " * 1000

    r = client.post(
        "/v1/council/verify", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    small = {"bundle": {"files": [{"path": "a.py", "content": CLEAN_CODE}]}, "wait": False}
    assert client.post("/v1/council/verify", json=small).status_code == 202


def test_coverage_policy_fail_is_422(make_client, proj):
    client = make_client(coverage_policy="fail")
    sha = proj.commit("add env", {".env": "PASSWORD=hunter2\n", "db.py": SQL_INJECTION})
    r = client.post("/v1/council/verify", json={"repo": str(proj.root), "snapshot_id": sha})
    assert r.status_code == 422
    assert "coverage policy 'fail'" in r.json()["detail"] and ".env" in r.json()["detail"]
    r = client.post(
        "/v1/council/verify",
        json={
            "bundle": {
                "files": [
                    {"path": ".env", "content": "A=1"},
                    {"path": "a.py", "content": "x = 1\n"},
                ]
            }
        },
    )
    assert r.status_code == 422 and "denied_secret" in r.json()["detail"]


def test_no_council_configured_is_503(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = CouncilSettings(models=["openrouter:x/y"], chairman="openrouter:x/y")
    with TestClient(create_app(settings, base_dir=tmp_path)) as client:
        r = client.post(
            "/v1/council/verify", json={"bundle": {"files": [{"path": "a.py", "content": "x"}]}}
        )
        assert r.status_code == 503 and "OPENROUTER_API_KEY" in r.json()["detail"]


# Inline bundles and the secret boundary -----------------------------------------------


def test_inline_bundle_secrets_are_omitted_and_never_leave(make_client, fake_provider, tmp_path):
    client = make_client()
    files = [
        {"path": "app/db.py", "content": SQL_INJECTION},
        {"path": ".env", "content": f"API_KEY={CANARY}-env\n"},
        {"path": "config/.ENV.production", "content": f"X={CANARY}-nested\n"},
        {"path": "deploy/id_rsa", "content": f"-----BEGIN KEY----- {CANARY}-rsa"},
        {"path": ".env.example", "content": "API_KEY=changeme\n"},
        {"path": "tool.sh", "content": "#!/bin/sh\necho hi\n", "executable": True},
    ]
    r = client.post(
        "/v1/council/verify", json={"snapshot_id": "abc1234", "bundle": {"files": files}}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    omitted = {o["path"]: o["reason"] for o in body["coverage"]["omitted"]}
    assert omitted == {
        ".env": "denied_secret",
        "config/.ENV.production": "denied_secret",
        "deploy/id_rsa": "denied_secret",
    }
    assert set(body["coverage"]["reviewed"]) == {"app/db.py", ".env.example", "tool.sh"}
    assert body["verdict"] == "fail"  # the SQL injection is still found
    assert body["snapshot"] == {"requested": "abc1234", "resolved": "abc1234", "repo": None}

    prompts = fake_provider.prompts(verification=body["verification_id"])
    assert prompts
    assert not [p for p in prompts if CANARY in p["prompt"] or CANARY in (p.get("system") or "")]
    folder = Path(body["transcript_location"])
    for f in folder.iterdir():
        assert CANARY not in f.read_text(errors="replace"), f.name
    for db_file in (tmp_path / ".council").glob("council.db*"):
        assert CANARY.encode() not in db_file.read_bytes()
    assert CANARY not in client.get(f"/v1/council/verifications/{body['verification_id']}").text

    # Naming a secret explicitly does not re-admit it.
    r = client.post(
        "/v1/council/verify",
        json={"bundle": {"files": files}, "target_paths": [".env", "app/db.py"]},
    )
    body = r.json()
    assert body["coverage"]["reviewed"] == ["app/db.py"]
    assert {"path": ".env", "reason": "denied_secret", "origin": "explicit", "changed": True} in (
        body["coverage"]["omitted"]
    )
    assert body["verdict"] in ("fail", "unclear")


def test_inline_bundle_bad_paths_are_422(make_client):
    client = make_client()
    for files, field in (
        ([{"path": "../x.py", "content": "x"}], "bundle.files[0].path"),
        ([{"path": "/etc/passwd", "content": "x"}], "bundle.files[0].path"),
        ([{"path": "a/../../b", "content": "x"}], "bundle.files[0].path"),
        ([{"path": "a.py", "content": "x"}, {"path": "./a.py", "content": "y"}],
         "bundle.files[1].path"),
        ([{"path": ".", "content": "x"}], "bundle.files[0].path"),
        ([{"path": "a", "content": "x"}, {"path": "a/b.py", "content": "y"}], "bundle.files"),
    ):  # fmt: skip
        r = client.post("/v1/council/verify", json={"bundle": {"files": files}})
        assert r.status_code == 422, (files, r.text)
        assert r.json()["field"] == field, r.json()
    r = client.post("/v1/council/verify", json={"bundle": {"files": []}})
    assert r.status_code == 422
    r = client.post(
        "/v1/council/verify",
        json={"bundle": {"files": [{"path": "a.py", "content": "x"}]}, "target_paths": ["../a"]},
    )
    assert r.status_code == 422 and r.json()["field"] == "target_paths[0]"


def test_inline_bundle_binary_oversize_and_missing(make_client):
    client = make_client(max_file_chars=1000)
    files = [
        {"path": "ok.py", "content": "x = 1\n"},
        {"path": "blob.bin", "content": "a\u0000b"},
        {"path": "big.py", "content": "y" * 5000},
        {"path": "package-lock.json", "content": "{}"},
    ]
    r = client.post(
        "/v1/council/verify", json={"bundle": {"files": files}, "snapshot_id": "deadbeef"}
    )
    body = r.json()
    reasons = {o["path"]: o["reason"] for o in body["coverage"]["omitted"]}
    assert reasons == {"blob.bin": "binary", "big.py": "too_large", "package-lock.json": "noise"}
    r = client.post(
        "/v1/council/verify",
        json={"bundle": {"files": files}, "target_paths": ["ok.py", "nothere.py"]},
    )
    body = r.json()
    assert body["coverage"]["reviewed"] == ["ok.py"]
    assert body["coverage"]["omitted"] == [
        {"path": "nothere.py", "reason": "not_found", "origin": "explicit", "changed": True}
    ]
    assert body["verdict"] == "unclear" and body["unclear_reason"] == "incomplete_coverage"


# Metrics, health, dispositions ------------------------------------------------------------


def test_metrics_and_health(make_client, proj):
    client = make_client(members=("careful-1", "careful-2", "careful-3", "auth401-1"))
    sha = proj.commit("add query", {"db.py": SQL_INJECTION})
    r = client.post("/v1/council/verify", json={"repo": str(proj.root), "snapshot_id": sha})
    assert r.json()["verdict"] == "fail"
    text = client.get("/metrics").text
    assert 'llm_council_verifications_total{tier="balanced",verdict="fail"} 1.0' in text
    assert 'llm_council_stage_duration_seconds_count{runner="embedded",stage="stage1"' in text
    assert 'llm_council_provider_call_duration_seconds_count{model="careful-1"' in text
    assert any(
        line.startswith("llm_council_provider_errors_total{")
        and 'kind="auth"' in line
        and 'model="auth401-1"' in line
        for line in text.splitlines()
    ), text
    assert "llm_council_queue_depth" not in text  # no broker configured
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "checks": {"database": {"ok": True, "detail": None}}}


def test_dispositions(make_client, proj):
    client = make_client()
    sha = proj.commit("add query", {"db.py": SQL_INJECTION})
    body = client.post(
        "/v1/council/verify", json={"repo": str(proj.root), "snapshot_id": sha}
    ).json()
    vid = body["verification_id"]
    url = f"/v1/council/verifications/{vid}/dispositions"
    r = client.post(url, json={"decision": "accept", "author": "ana", "note": "agreed"})
    assert r.status_code == 201, r.text
    r = client.post(url, json={"decision": "reject", "finding_index": 0})
    assert r.status_code == 201 and len(r.json()["finding_fingerprint"]) == 64
    n = len(body["findings"])
    r = client.post(url, json={"decision": "reject", "finding_index": n})
    assert r.status_code == 422 and r.json()["field"] == "finding_index"
    assert client.post(url, json={"decision": "maybe"}).status_code == 422
    listed = client.get(url).json()
    assert [(d["decision"], d["finding_index"]) for d in listed] == [
        ("accept", None),
        ("reject", 0),
    ]
    assert (
        client.post(
            "/v1/council/verifications/ffff/dispositions", json={"decision": "accept"}
        ).status_code
        == 404
    )
