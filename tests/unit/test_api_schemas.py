"""HTTP schemas and the small pure helpers behind the API (no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from api.db.engine import default_database_url, normalise_url, redact
from api.db.repository import finding_fingerprint, verification_id_of
from api.schemas import DispositionIn, VerifyBody
from api.service import InvalidInput, _bundle_reason, _normalise_targets, valid_id
from shared.selection.ignorefiles import IgnoreRules
from shared.settings import CouncilSettings


def errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def test_exactly_one_subject():
    VerifyBody(repo="proj")
    VerifyBody(bundle={"files": [{"path": "a.py", "content": ""}]})
    for body in ({}, {"repo": "p", "bundle": {"files": [{"path": "a", "content": ""}]}}):
        with pytest.raises(ValidationError, match="exactly one of 'repo'"):
            VerifyBody(**body)


def test_defaults_and_limits():
    body = VerifyBody(repo="p")
    assert (body.snapshot_id, body.tier, body.wait, body.target_paths) == ("HEAD", None, True, None)
    with pytest.raises(ValidationError) as info:
        VerifyBody(repo="p", tier="enormous")
    assert "tier" in errors(info.value)
    with pytest.raises(ValidationError):
        VerifyBody(repo="p", confidence_threshold=1.5)
    with pytest.raises(ValidationError):
        VerifyBody(repo="p", snapshot_id="")
    with pytest.raises(ValidationError):
        VerifyBody(repo="p", extra=1)
    with pytest.raises(ValidationError):
        VerifyBody(repo="p", target_paths=["x" * 5000])
    with pytest.raises(ValidationError):
        VerifyBody(bundle={"files": []})


@pytest.mark.parametrize(
    "body",
    [
        {"repo": "p", "snapshot_id": "\ud800"},
        {"repo": "p\udcff"},
        {"repo": "p", "target_paths": ["a\ud83d"]},
        {"repo": "p", "rubric_focus": ["\udfff"]},
        {"bundle": {"files": [{"path": "a.py", "content": "x\ud800y"}]}},
    ],
)
def test_lone_surrogates_are_refused(body):
    with pytest.raises(ValidationError, match=r"(?i)unicode"):
        VerifyBody(**body)


def test_disposition_input():
    assert DispositionIn(decision="accept").finding_index is None
    for bad in (
        {"decision": "maybe"},
        {"decision": "accept", "finding_index": -1},
        {"decision": "accept", "note": "a\x00b"},
        {"decision": "accept", "author": "\ud800"},
    ):
        with pytest.raises(ValidationError):
            DispositionIn(**bad)


def test_target_path_normalisation():
    assert _normalise_targets(["./a//b.py", "src/", "."], "target_paths") == ["a/b.py", "src", ""]
    for bad in ("../x", "a/../../b", "/etc/passwd", "C:/x", "", "a\x00b", "a\nb"):
        with pytest.raises(InvalidInput) as info:
            _normalise_targets(["ok.py", bad], "target_paths")
        assert info.value.field == "target_paths[1]"
        assert "--file-paths" not in info.value.message


def test_bundle_rules_follow_the_selection_order():
    s = CouncilSettings(max_file_chars=10)
    none = IgnoreRules()
    ignore = IgnoreRules.parse(".llmignore", "gen/\n")
    assert _bundle_reason("config/.ENV.prod", "x", "explicit", none, s) == "denied_secret"
    assert _bundle_reason(".env.example", "x", "discovered", none, s) is None
    assert _bundle_reason("gen/a.py", "x", "explicit", ignore, s) == "ignored"
    assert _bundle_reason("yarn.lock", "x", "discovered", none, s) == "noise"
    assert _bundle_reason("yarn.lock", "x", "explicit", none, s) is None
    assert _bundle_reason("logo.svg", "<svg/>", "discovered", none, s) == "binary"
    assert _bundle_reason("a.bin", "a\x00b", "explicit", none, s) == "binary"
    assert _bundle_reason("a.py", "x" * 11, "explicit", none, s) == "too_large"
    assert _bundle_reason("main.zig", "x", "explicit", none, s) is None
    allow = CouncilSettings(file_selection="allowlist")
    assert _bundle_reason("main.zig", "x", "explicit", none, allow) == "non-text"


def test_ids_and_fingerprints():
    assert valid_id("a" * 32) and not valid_id("") and not valid_id("a-b") and not valid_id("é")
    assert not valid_id("a" * 65)
    assert verification_id_of(Path("20300101T000000Z-abc123")) == "abc123"
    assert verification_id_of(Path("nodash")) is None
    f = {"severity": "critical", "location": "a.py:1", "description": "sql"}
    assert finding_fingerprint(f) == finding_fingerprint(dict(reversed(list(f.items()))))
    assert finding_fingerprint(f) != finding_fingerprint({**f, "location": "a.py:2"})


def test_database_urls(tmp_path):
    s = CouncilSettings()
    assert default_database_url(s, tmp_path) == f"sqlite:///{tmp_path}/.council/council.db"
    assert normalise_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("sqlite:///x.db") == "sqlite:///x.db"
    assert redact("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
