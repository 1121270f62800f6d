"""Persistence against SQLite and the PostgreSQL on 127.0.0.1:5432 (or
LLM_COUNCIL_TEST_DATABASE_URL): schema and version check, the verification lifecycle,
search, dispositions, transcript sync, and the `history` / `audit` commands.

Each PostgreSQL test works in its own schema (dropped afterwards), so parallel runs do not
collide. PostgreSQL tests are skipped, with the reason, only when it cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from api.db import engine as db_engine
from api.db.engine import SchemaVersionError, init_db, make_engine
from api.db.repository import (
    VerificationFilter,
    VerificationStore,
    ingest_transcripts,
)
from api.db.tables import SCHEMA_VERSION
from shared import transcript
from shared.embedded import run_embedded
from shared.models import CoverageReceipt
from shared.pipeline import plan_run
from shared.providers.client import HttpProviderClient, ProviderKeys
from shared.request import VerifyRequest
from shared.response import VerifyResponse
from shared.settings import CouncilSettings
from shared.subject import Subject, SubjectFile
from shared.tiers import Tier
from tests.helpers import CLEAN_CODE, SQL_INJECTION, GitRepo

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("llm-council"))
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")


def _pg_admin_url() -> str:
    return os.environ.get("LLM_COUNCIL_TEST_DATABASE_URL") or PG_DEFAULT


def _pg_reachable(url: str) -> str | None:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return None


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'council.db'}"
        return
    import psycopg

    admin = _pg_admin_url()
    why = _pg_reachable(admin)
    if why is not None:
        pytest.skip(f"PostgreSQL unreachable at {admin} ({why})")
    schema = f"llmc_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in admin else "?"
    yield f"{admin}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def store(database_url):
    engine = make_engine(database_url)
    init_db(engine)
    yield VerificationStore(engine)
    engine.dispose()


@pytest.fixture
def council(fake_provider, tmp_path):
    base = fake_provider.openai_base
    return CouncilSettings(
        models=[f"openai-compat@{base}:{m}" for m in MEMBERS],
        chairman=f"openai-compat@{base}:careful-chair",
        transcript_dir=tmp_path / "logs",
    )


def run_one(settings: CouncilSettings, content: str, *, tier=Tier.BALANCED, snap="abc1234"):
    subject = Subject(
        snapshot_requested=snap,
        snapshot_resolved=snap,
        files=(SubjectFile(path="db.py", content=content),),
        coverage=CoverageReceipt(reviewed=("db.py",), policy="clamp"),
    )
    plan = plan_run(VerifyRequest(snapshot_id=snap, tier=tier), settings, subject)
    return plan, run_embedded(plan, HttpProviderClient(ProviderKeys.from_settings(settings)))


# Schema --------------------------------------------------------------------------------


def test_schema_is_created_once_and_its_version_recorded(database_url):
    engine = make_engine(database_url)
    try:
        assert init_db(engine) == SCHEMA_VERSION
        assert init_db(engine) == SCHEMA_VERSION  # idempotent
        names = set(inspect(engine).get_table_names())
        assert {"verifications", "dispositions", "llm_council_schema_version"} <= names
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, version FROM llm_council_schema_version")).all()
        assert [tuple(r) for r in rows] == [(1, SCHEMA_VERSION)]
    finally:
        engine.dispose()


def test_schema_version_mismatch_stops_start_up(database_url, monkeypatch):
    engine = make_engine(database_url)
    try:
        init_db(engine)

        def set_version(v: int) -> None:
            with engine.begin() as conn:
                conn.execute(text("UPDATE llm_council_schema_version SET version = :v"), {"v": v})

        set_version(SCHEMA_VERSION + 1)
        with pytest.raises(SchemaVersionError, match="newer than this llm-council"):
            init_db(engine)
        set_version(SCHEMA_VERSION - 1)
        with pytest.raises(SchemaVersionError, match="no migration"):
            init_db(engine)
        ran = []
        monkeypatch.setitem(db_engine.MIGRATIONS, SCHEMA_VERSION - 1, lambda conn: ran.append(1))
        assert init_db(engine) == SCHEMA_VERSION
        assert ran == [1]
        assert init_db(engine) == SCHEMA_VERSION and ran == [1]
    finally:
        engine.dispose()


def test_unreachable_database_is_a_clear_error(tmp_path):
    from api.db.engine import DatabaseError, open_database

    settings = CouncilSettings(database_url="postgresql://nobody:pw@127.0.0.1:1/none")
    with pytest.raises(DatabaseError) as info:
        open_database(settings)
    assert "cannot open the database" in str(info.value)
    assert "pw" not in str(info.value)


# Lifecycle, search, dispositions -------------------------------------------------------


def test_a_verification_from_plan_to_payload(store, council):
    subject = Subject(
        snapshot_requested="HEAD",
        snapshot_resolved="f" * 40,
        files=(SubjectFile(path="db.py", content=SQL_INJECTION),),
        coverage=CoverageReceipt(reviewed=("db.py",), policy="clamp"),
    )
    plan = plan_run(VerifyRequest(tier=Tier.QUICK), council, subject)
    vid = plan.verification_id
    store.record_planned(plan, source="api", runner="embedded")
    store.record_planned(plan, source="api", runner="embedded")  # idempotent
    row = store.get(vid)
    assert (row.state, row.tier, row.snapshot_requested, row.snapshot_resolved) == (
        "queued",
        "quick",
        "HEAD",
        "f" * 40,
    )
    assert row.deadline_at is not None and row.payload is None
    store.record_progress(vid, "stage1")
    assert store.get(vid).state == "stage1"
    assert [r.id for r in store.active()] == [vid]

    payload = run_embedded(plan, HttpProviderClient(ProviderKeys.from_settings(council)))
    store.record_payload(payload, source="api")
    store.record_payload(payload, source="api")  # idempotent upsert
    row = store.get(vid)
    assert (row.state, row.verdict, row.exit_code, row.runner) == ("done", "fail", 1, "embedded")
    assert row.finished_at is not None and row.timing == payload.timing
    assert VerifyResponse.model_validate(row.payload) == payload
    assert row.transcript_location == plan.transcript_path
    store.record_progress(vid, "stage2")
    store.record_failure(vid, "late failure")
    assert store.get(vid).state == "done"
    assert store.active() == []
    rows, total = store.search(VerificationFilter())
    assert total == 1 and rows[0].id == vid


def test_a_failed_run_is_recorded_as_error(store, council):
    subject = Subject(snapshot_requested="x", snapshot_resolved="x")
    plan = plan_run(VerifyRequest(), council, subject)
    store.record_planned(plan, source="mcp", runner="embedded")
    store.record_failure(plan.verification_id, "the embedded runner failed: boom")
    row = store.get(plan.verification_id)
    assert row.state == "error" and row.failure.endswith("boom") and row.source == "mcp"


def test_search_filters_and_pages(store, council):
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    _, fail = run_one(council, SQL_INJECTION, snap="aaaa1111")
    _, ok = run_one(council, CLEAN_CODE, tier=Tier.QUICK, snap="bbbb2222")
    made = []
    for i in range(5):
        base = fail if i % 2 == 0 else ok
        payload = base.model_copy(update={"verification_id": f"v{i:031d}"})
        store.record_payload(
            payload, source="api", created_at=(t0 + timedelta(hours=i)).timestamp()
        )
        made.append(payload.verification_id)

    def ids(**kw) -> list[str]:
        rows, _ = store.search(VerificationFilter(**kw), limit=50)
        return [r.id for r in rows]

    assert ids() == list(reversed(made))
    assert ids(verdict="fail") == [made[4], made[2], made[0]]
    assert ids(tier="quick") == [made[3], made[1]]
    assert ids(verdict="pass", tier="balanced") == []
    assert ids(snapshot="bbbb") == [made[3], made[1]]
    assert ids(snapshot="aaaa1111") == [made[4], made[2], made[0]]
    assert ids(snapshot="a%") == []  # LIKE wildcards are literal
    assert ids(since=t0 + timedelta(hours=3)) == [made[4], made[3]]
    assert ids(until=t0 + timedelta(hours=1)) == [made[0]]
    assert ids(state="done") == list(reversed(made))
    rows, total = store.search(VerificationFilter(), limit=2, offset=2)
    assert total == 5 and [r.id for r in rows] == [made[2], made[1]]
    assert sorted(store.counts()) == [("fail", "balanced", 3), ("pass", "quick", 2)]


def test_dispositions_belong_to_a_verification(store, council):
    _, payload = run_one(council, SQL_INJECTION)
    store.record_payload(payload, source="api")
    d = store.add_disposition(
        payload.verification_id,
        decision="reject",
        finding_index=0,
        finding_fingerprint="0" * 64,
        author="ana",
        note="false positive",
    )
    assert d.id is not None
    assert [x.decision for x in store.dispositions(payload.verification_id)] == ["reject"]
    with pytest.raises(IntegrityError):
        store.add_disposition(
            "unknown",
            decision="accept",
            finding_index=None,
            finding_fingerprint=None,
            author=None,
            note=None,
        )


def test_concurrent_upserts_leave_one_row(store, council):
    _, payload = run_one(council, CLEAN_CODE)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            store.record_payload(payload, source="api")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert store.search(VerificationFilter())[1] == 1


# Transcript sync ---------------------------------------------------------------------------


def test_transcripts_are_indexed_once_and_tampered_ones_are_not(store, council, tmp_path):
    base = tmp_path / "logs"
    plan_a, a = run_one(council, SQL_INJECTION)
    plan_b, _ = run_one(council, CLEAN_CODE)
    plan_c, _ = run_one(council, SQL_INJECTION)
    # b: a file altered after sealing. c: verdict edited and the seal rewritten to match.
    stage1 = plan_b.folder / "stage1.json"
    stage1.write_text(stage1.read_text() + " ")
    result = json.loads((plan_c.folder / "result.json").read_text())
    result["verdict"], result["exit_code"] = "pass", 0
    (plan_c.folder / "result.json").write_text(json.dumps(result))
    transcript.seal(plan_c.folder)
    # An unfinished run (no result.json) and a stray folder are left alone.
    (base / "20300101T000000Z-unfinished").mkdir()
    (base / "not-a-transcript").mkdir()

    report = ingest_transcripts(store, [base, tmp_path / "missing"])
    assert report.added == [a.verification_id]
    skipped = dict(report.skipped)
    assert "stage1.json was altered" in skipped[str(plan_b.folder)]
    assert "unreadable" in skipped[str(plan_c.folder)]
    row = store.get(a.verification_id)
    assert row.source == "transcript" and row.verdict == "fail"
    assert row.created_at is not None
    assert abs(row.created_at.replace(tzinfo=UTC).timestamp() - plan_a.created_at) < 1
    assert ingest_transcripts(store, [base]).added == []


# The commands ----------------------------------------------------------------------------


def _cli(repo: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )


def test_history_and_audit_show_gate_runs(database_url, tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLM_COUNCIL_") or k.startswith("LLM_COUNCIL_TEST_")
    }
    env["COLUMNS"] = "200"
    if not database_url.startswith("sqlite"):
        env["LLM_COUNCIL_DATABASE_URL"] = database_url
    repo = GitRepo(tmp_path / "proj")
    repo.commit("init", {"app.py": CLEAN_CODE})
    bad = repo.commit("add query", {"db.py": SQL_INJECTION})
    good = repo.commit("clean", {"users.py": CLEAN_CODE})
    runs = {}
    for name, sha in (("bad", bad), ("good", good)):
        proc = _cli(repo.root, "gate", "--offline", "--snapshot", sha, "--output-format", "json",
                    env=env)  # fmt: skip
        runs[name] = json.loads(proc.stdout)
    assert runs["bad"]["verdict"] == "fail" and runs["good"]["verdict"] == "pass"

    proc = _cli(repo.root, "history", env=env)
    assert proc.returncode == 0, proc.stderr
    for payload in runs.values():
        assert payload["verification_id"][:12] in proc.stdout
    assert "fail" in proc.stdout and "transcript" in proc.stdout

    proc = _cli(repo.root, "history", "--verdict", "fail", "--output-format", "json", env=env)
    items = json.loads(proc.stdout)["items"]
    assert [i["verification_id"] for i in items] == [runs["bad"]["verification_id"]]
    assert items[0]["snapshot"] == bad and items[0]["source"] == "transcript"
    assert _cli(repo.root, "history", "--tier", "huge", env=env).returncode == 2

    vid = runs["bad"]["verification_id"]
    proc = _cli(repo.root, "audit", "--validate", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert vid in proc.stdout
    proc = _cli(repo.root, "audit", vid, "--validate", env=env)
    assert proc.returncode == 0 and "integrity: ok" in proc.stdout, proc.stdout

    folder = Path(runs["bad"]["transcript_location"])
    chairman = folder / "chairman.json"
    chairman.write_text(chairman.read_text().replace("critical", "minor"))
    proc = _cli(repo.root, "audit", vid, "--validate", env=env)
    assert proc.returncode == 1
    assert "chairman.json was altered" in proc.stdout
    proc = _cli(repo.root, "audit", "--validate", "--output-format", "json", env=env)
    assert proc.returncode == 1
    listed = {t["verification_id"]: t for t in json.loads(proc.stdout)["transcripts"]}
    assert listed[vid]["integrity_ok"] is False
    assert listed[runs["good"]["verification_id"]]["integrity_ok"] is True
    proc = _cli(repo.root, "audit", "f" * 32, env=env)
    assert proc.returncode == 2 and "no transcript" in proc.stderr
