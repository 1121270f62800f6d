"""resolve_subject against real git repositories built in temp dirs (argument lists only)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import shared.selection.resolve as resolve_mod
from api.cli_ignore import ignore
from shared.selection import (
    IGNORE_FILE_CHAIN,
    CoveragePolicyError,
    SubjectError,
    explain_path,
    resolve_subject,
)
from shared.settings import CouncilSettings
from shared.subject import Subject

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.test",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.test",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


class Repo:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q")
        self.git("checkout", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        cmd = [
            "git",
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.test",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
            "-C",
            str(self.root),
            *args,
        ]
        out = subprocess.run(cmd, env={**os.environ, **GIT_ENV}, capture_output=True, check=True)
        return out.stdout.decode().strip()

    def write(self, path: str, content: str | bytes) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)

    def symlink(self, path: str, target: str) -> None:
        link = self.root / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)

    def commit(self, message: str = "change", files: dict[str, str | bytes] | None = None) -> str:
        for path, content in (files or {}).items():
            self.write(path, content)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def blob(self, rev: str, path: str) -> str:
        return self.git("rev-parse", f"{rev}:{path}")

    def resolve(
        self, file_paths: list[str] | None = None, snapshot: str = "HEAD", **settings: Any
    ) -> Subject:
        return resolve_subject(
            self.root, snapshot, file_paths, settings=CouncilSettings(**settings)
        )


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "repo")


def reasons(subject: Subject) -> dict[str, str]:
    return {o.path: o.reason for o in subject.coverage.omitted}


def content_of(subject: Subject, path: str) -> str:
    return next(f.content for f in subject.files if f.path == path)


def check_invariants(subject: Subject) -> None:
    cov = subject.coverage
    assert cov.conservation_ok
    assert set(cov.reviewed).isdisjoint(o.path for o in cov.omitted)
    assert cov.reviewed == subject.paths
    assert cov.explicit_omitted == any(o.origin == "explicit" for o in cov.omitted)


# The changed set -------------------------------------------------------------------------


def test_root_commit_reviews_all_its_files(repo):
    sha = repo.commit("root", {"a.py": "print('a')\n", "docs/b.md": "# b\n"})
    subject = repo.resolve()
    assert subject.snapshot_requested == "HEAD"
    assert subject.snapshot_resolved == sha and len(sha) == 40
    assert subject.paths == ("a.py", "docs/b.md")
    assert subject.coverage.requested is None
    assert subject.coverage.policy == "clamp"
    assert subject.expanded_paths is None
    assert subject.repo == str(repo.root)
    check_invariants(subject)


def test_normal_commit_reviews_only_what_changed(repo):
    repo.commit("one", {"a.py": "a = 1\n", "b.py": "b = 1\n"})
    repo.commit("two", {"b.py": "b = 2\n", "c.py": "c = 1\n"})
    subject = repo.resolve()
    assert subject.paths == ("b.py", "c.py")
    assert content_of(subject, "b.py") == "b = 2\n"
    assert all(f.changed for f in subject.files)
    first = repo.git("rev-parse", "HEAD~1")
    assert repo.resolve(snapshot=first[:10]).snapshot_resolved == first


def test_merge_commit_reviews_exactly_its_first_parent_diff(repo):
    repo.commit("base", {"base.py": "x = 0\n"})
    repo.git("checkout", "-q", "-b", "feature")
    repo.commit("feature work", {"feature.py": "f = 1\n", "base.py": "x = 1\n"})
    repo.git("checkout", "-q", "main")
    repo.commit("main moves on", {"main_only.py": "m = 1\n"})
    repo.git("merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    merge = repo.git("rev-parse", "HEAD")
    assert len(repo.git("rev-list", "--parents", "-n", "1", merge).split()) == 3
    subject = repo.resolve(snapshot=merge)
    assert subject.paths == ("base.py", "feature.py")  # not main_only.py


def test_rename_is_reviewed_under_its_new_path(repo):
    body = "".join(f"line {i}\n" for i in range(40))
    repo.commit("one", {"old/name.py": body})
    (repo.root / "new").mkdir()
    repo.git("mv", "old/name.py", "new/name.py")
    repo.commit("rename")
    subject = repo.resolve()
    assert subject.paths == ("new/name.py",)
    assert not subject.coverage.omitted


def test_renaming_a_secret_does_not_leak_it(repo):
    body = "".join(f"SECRET_{i}=rename-canary-{i}\n" for i in range(20))
    repo.commit("one", {".env": body, "a.py": "a\n"})
    (repo.root / "conf").mkdir()
    repo.git("mv", ".env", "conf/settings.txt")
    repo.commit("rename the secret")
    for subject in (repo.resolve(), repo.resolve(["conf/settings.txt"]), repo.resolve(["conf"])):
        assert reasons(subject) == {"conf/settings.txt": "denied_secret"}
        assert "rename-canary" not in subject.model_dump_json()


def test_non_utf8_file_names_are_rendered_safely(repo):
    repo.commit("base", {"a.py": "a\n"})
    env = {**os.environ, **GIT_ENV}
    blob = subprocess.run(
        ["git", "-C", str(repo.root), "hash-object", "-w", "--stdin"],
        input=b"x = 1\n",
        capture_output=True,
        check=True,
        env=env,
    )
    info = b"100644," + blob.stdout.strip() + b",caf\xe9.py"
    subprocess.run(
        [b"git", b"-C", bytes(repo.root), b"update-index", b"--add", b"--cacheinfo", info],
        check=True,
        env=env,
    )
    repo.git("commit", "-q", "-m", "latin-1 name")
    subject = repo.resolve()
    assert subject.paths == ("caf\\xe9.py",)
    assert json.loads(subject.model_dump_json())["files"][0]["content"] == "x = 1\n"


def test_deleted_files_are_warnings_not_omissions(repo):
    repo.commit("one", {"a.py": "a = 1\n", "gone.py": "g = 1\n"})
    (repo.root / "gone.py").unlink()
    repo.commit("two", {"a.py": "a = 2\n"})
    subject = repo.resolve()
    assert subject.paths == ("a.py",)
    assert subject.coverage.omitted == ()
    assert any("gone.py" in w for w in subject.expansion_warnings)

    (repo.root / "a.py").unlink()
    repo.commit("delete only")
    only_deletes = repo.resolve()
    assert only_deletes.files == () and only_deletes.coverage.omitted == ()
    assert any("a.py" in w for w in only_deletes.expansion_warnings)


def test_shallow_clone_boundary_is_not_a_root_commit(repo, tmp_path):
    repo.commit("one", {"src/a.py": "a\n", "src/b.py": "b\n", "README.md": "r\n"})
    repo.commit("two", {"src/a.py": "a = 2\n"})
    clone = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo.root}", str(clone)],
        check=True,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
    )
    settings = CouncilSettings()
    with pytest.raises(SubjectError, match="shallow clone"):
        resolve_subject(clone, "HEAD", None, settings=settings)
    named = resolve_subject(clone, "HEAD", ["src"], settings=settings)
    assert named.paths == ("src/a.py", "src/b.py") and all(f.changed for f in named.files)
    assert any("changed set is unknown" in w for w in named.expansion_warnings)


def test_executable_bit_is_kept(repo):
    repo.write("run.sh", "#!/bin/sh\necho hi\n")
    (repo.root / "run.sh").chmod(0o755)
    repo.commit("script")
    assert repo.resolve().files[0].executable


# Explicit files and directories ----------------------------------------------------------


def test_explicit_files_and_directories_with_cap(repo):
    files: dict[str, str | bytes] = {f"src/m{i}.py": f"m = {i}\n" for i in range(6)}
    files["other.py"] = "o = 1\n"
    repo.commit("base", files)
    repo.commit("touch two", {"src/m1.py": "m = 11\n", "src/m5.py": "m = 55\n"})
    subject = repo.resolve(["src", "src/m5.py", "other.py", "missing.py"], max_files_expansion=3)
    check_invariants(subject)
    cov = subject.coverage
    assert cov.requested == ("src", "src/m5.py", "other.py", "missing.py")
    # the named file does not count toward the cap and keeps origin explicit
    assert subject.paths == ("src/m0.py", "src/m1.py", "src/m2.py", "src/m5.py", "other.py")
    assert subject.expanded_paths == ("src/m0.py", "src/m1.py", "src/m2.py")
    assert subject.paths_truncated and cov.truncated
    assert any("src/" in w and "max_files_expansion=3" in w for w in subject.expansion_warnings)
    omitted = {o.path: o for o in cov.omitted}
    assert omitted["src/"].reason == "truncated" and omitted["src/"].changed
    assert omitted["missing.py"].reason == "not_found"
    assert omitted["missing.py"].origin == "explicit" and cov.explicit_omitted
    changed = {f.path: f.changed for f in subject.files}
    assert changed == {
        "src/m0.py": False,
        "src/m1.py": True,
        "src/m2.py": False,
        "src/m5.py": True,
        "other.py": True,
    }


def test_repeated_and_nested_directories_are_listed_once(repo):
    repo.commit("base", {f"src/sub/m{i}.py": f"m = {i}\n" for i in range(4)})
    subject = repo.resolve(["src", "src/", "./src/sub", "src/sub/m3.py"], max_files_expansion=2)
    check_invariants(subject)
    assert subject.paths == ("src/sub/m0.py", "src/sub/m1.py", "src/sub/m3.py")
    assert [o.path for o in subject.coverage.omitted] == ["src/", "src/sub/"]


def test_whole_tree_and_untruncated_directory(repo):
    repo.commit("base", {"a/x.py": "x\n", "a/y.py": "y\n", "b.py": "b\n"})
    whole = repo.resolve(["."])
    assert whole.paths == ("a/x.py", "a/y.py", "b.py") and not whole.paths_truncated
    only_a = repo.resolve(["./a/"])
    assert only_a.paths == ("a/x.py", "a/y.py") and only_a.coverage.omitted == ()


def test_explicit_noise_and_generated_files_are_reviewed(repo):
    repo.commit(
        "base",
        {
            ".gitattributes": "gen.py linguist-generated\n",
            "package-lock.json": "{}\n",
            "gen.py": "g = 1\n",
            "d/yarn.lock": "y\n",
        },
    )
    subject = repo.resolve(["package-lock.json", "gen.py", "d"])
    assert subject.paths == ("package-lock.json", "gen.py")
    assert reasons(subject) == {"d/yarn.lock": "noise"}


@pytest.mark.parametrize(
    "bad", ["../outside.py", "src/../../etc/passwd", "/etc/passwd", "a/../b.py", ""]
)
def test_paths_escaping_the_repo_are_refused(repo, bad):
    repo.commit("base", {"a.py": "a\n"})
    with pytest.raises(SubjectError) as info:
        repo.resolve(["a.py", bad])
    message = str(info.value)
    assert "\n" not in message and "--file-paths" in message


def test_setup_errors_are_one_clear_line(repo, tmp_path):
    repo.commit("base", {"a.py": "a\n"})
    with pytest.raises(SubjectError, match="unknown revision 'no-such-branch'"):
        repo.resolve(snapshot="no-such-branch")
    with pytest.raises(SubjectError, match="unknown revision"):
        repo.resolve(snapshot="--output=/tmp/x")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(SubjectError, match="not a git repository"):
        resolve_subject(plain, "HEAD", None, settings=CouncilSettings())
    with pytest.raises(SubjectError, match="does not exist"):
        resolve_subject(tmp_path / "nope", "HEAD", None, settings=CouncilSettings())


# Classification from the snapshot --------------------------------------------------------


def test_binary_files_are_omitted(repo):
    repo.commit("bin", {"img.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a.py": "a\n"})
    subject = repo.resolve()
    assert subject.paths == ("a.py",)
    assert reasons(subject) == {"img.png": "binary"}


def test_gitattributes_generated_vendored_binary(repo):
    repo.commit(
        "attrs",
        {
            ".gitattributes": (
                "gen/** linguist-generated\n*.pb.go linguist-generated=true\n"
                "third/** linguist-vendored\n*.dat binary\n*.raw -text\n"
                "keep/package-lock.json -linguist-generated\n"
            ),
            "gen/out.py": "x = 1\n",
            "api.pb.go": "package api\n",
            "third/lib.c": "int x;\n",
            "data.dat": "plain text but marked binary\n",
            "notes.raw": "text\n",
            "keep/package-lock.json": "{}\n",
            "package-lock.json": "{}\n",
            "src/a.py": "a\n",
        },
    )
    subject = repo.resolve()
    assert reasons(subject) == {
        "gen/out.py": "generated",
        "api.pb.go": "generated",
        "third/lib.c": "vendored",
        "data.dat": "binary",
        "notes.raw": "binary",
        "package-lock.json": "noise",
    }
    assert set(subject.paths) == {".gitattributes", "keep/package-lock.json", "src/a.py"}
    # explicit naming does not override binary attributes
    assert reasons(repo.resolve(["data.dat"])) == {"data.dat": "binary"}


def test_attributes_are_read_from_the_commit_not_the_work_tree(repo):
    repo.commit(
        "attrs",
        {".gitattributes": "gen.py linguist-generated\n", "gen.py": "g = 1\n", "a.py": "a = 1\n"},
    )
    # work tree (and even the real index) now say the opposite
    repo.write(".gitattributes", "a.py linguist-generated\n")
    repo.git("add", ".gitattributes")
    subject = repo.resolve()
    assert reasons(subject) == {"gen.py": "generated"}
    assert "a.py" in subject.paths


def test_contents_come_from_the_commit_not_the_work_tree(repo):
    repo.commit("base", {"a.py": "committed = True\n", "b.py": "b\n"})
    repo.write("a.py", "work_tree_edit = True\n")
    (repo.root / "b.py").unlink()
    repo.write("untracked.py", "u\n")
    subject = repo.resolve()
    assert content_of(subject, "a.py") == "committed = True\n"
    assert "b.py" in subject.paths and "untracked.py" not in subject.paths
    assert "work_tree_edit" not in subject.model_dump_json()
    assert repo.resolve(["."]).paths == ("a.py", "b.py")


def test_svg_with_and_without_review_svg(repo):
    repo.commit("svg", {"logo.svg": "<svg xmlns='http://www.w3.org/2000/svg'/>\n"})
    assert reasons(repo.resolve()) == {"logo.svg": "binary"}
    assert repo.resolve(review_svg=True).paths == ("logo.svg",)
    assert reasons(repo.resolve(file_selection="allowlist")) == {"logo.svg": "non-text"}


def test_secrets_upper_case_and_nested_and_examples(repo):
    repo.commit(
        "secrets",
        {
            "config/.ENV.production": "DB_PASSWORD=hunter2\n",
            "deploy/keys/SERVER.PEM": "-----BEGIN PRIVATE KEY-----\n",
            "ops/.AWS/Credentials": "[default]\n",
            ".env.example": "DB_PASSWORD=changeme\n",
            "config/secrets.yaml.template": "password: <fill me>\n",
        },
    )
    subject = repo.resolve()
    assert reasons(subject) == {
        "config/.ENV.production": "denied_secret",
        "deploy/keys/SERVER.PEM": "denied_secret",
        "ops/.AWS/Credentials": "denied_secret",
    }
    assert content_of(subject, ".env.example") == "DB_PASSWORD=changeme\n"
    assert "config/secrets.yaml.template" in subject.paths
    # naming a secret explicitly does not help, whether or not it exists
    named = repo.resolve(["config/.ENV.production", ".env"])
    assert reasons(named) == {"config/.ENV.production": "denied_secret", ".env": "denied_secret"}
    assert named.files == () and named.coverage.explicit_omitted


def test_symlink_is_never_followed(repo):
    passwd = Path("/etc/passwd")
    repo.symlink("static/passwd", "/etc/passwd")
    repo.symlink("etc_dir", "/etc")
    repo.commit("links", {"a.py": "a\n"})
    subject = repo.resolve()
    link = content_of(subject, "static/passwd")
    assert "symbolic link" in link and "-> /etc/passwd" in link
    dumped = subject.model_dump_json()
    if passwd.exists():
        for line in passwd.read_text(errors="replace").splitlines():
            if line.strip():
                assert line not in dumped
    assert "root:x:0:0" not in dumped
    through = repo.resolve(["etc_dir/passwd", "etc_dir"])
    assert reasons(through) == {"etc_dir/passwd": "not_found"}
    assert through.paths == ("etc_dir",) and "-> /etc" in through.files[0].content


def test_submodule_is_reported_not_reviewed(repo):
    repo.commit("base", {"a.py": "a\n"})
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},libs/sub")
    repo.git("commit", "-q", "-m", "add submodule")
    subject = repo.resolve()
    assert reasons(subject) == {"libs/sub": "non-text"}
    assert any("submodule libs/sub" in w for w in subject.expansion_warnings)


def test_non_utf8_text(repo):
    latin = "# café crème brûlée\nprint('ok')\n".encode("latin-1")
    sjis = ("# " + "日本語のコメントです" * 20 + "\n").encode("shift_jis")
    repo.commit("enc", {"latin.py": latin, "sjis.py": sjis})
    subject = repo.resolve()
    assert "caf\ufffd cr\ufffdme" in content_of(subject, "latin.py")
    assert reasons(subject) == {"sjis.py": "garbage"}


def test_over_cap_files_are_too_large(repo):
    repo.commit(
        "big",
        {"small.py": "x" * 50 + "\n", "big.py": "y" * 150 + "\n", "huge.txt": "z" * 2_000_000},
    )
    subject = repo.resolve(max_file_chars=100)
    assert subject.paths == ("small.py",)
    assert reasons(subject) == {"big.py": "too_large", "huge.txt": "too_large"}


# Ignore files ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", IGNORE_FILE_CHAIN)
def test_each_ignore_file_in_the_chain(repo, name):
    repo.commit(
        "ignore",
        {
            name: "# comment\nfixtures/\n*.snap\n",
            "fixtures/a.json": "{}\n",
            "t/x.snap": "s\n",
            "src/a.py": "a\n",
        },
    )
    subject = repo.resolve()
    assert reasons(subject) == {"fixtures/a.json": "ignored", "t/x.snap": "ignored"}
    named = repo.resolve(["t/x.snap"])
    assert reasons(named) == {"t/x.snap": "ignored"}
    assert named.coverage.omitted[0].origin == "explicit"
    explanation = explain_path(repo.root, "HEAD", "t/x.snap", settings=CouncilSettings())
    assert explanation.ignore_file == name
    assert explanation.entries[0].rule == f"{name} line 3: '*.snap'"


def test_ignore_file_precedence_first_present_wins(repo):
    repo.commit(
        "chain", {".aiexclude": "a.py\n", ".cursorignore": "b.py\n", "a.py": "a\n", "b.py": "b\n"}
    )
    assert reasons(repo.resolve()) == {"a.py": "ignored"}
    repo.commit("add llmignore", {".llmignore": "b.py\n"})
    assert reasons(repo.resolve(["a.py", "b.py"])) == {"b.py": "ignored"}


def test_ignore_file_is_read_from_the_commit(repo):
    repo.commit("base", {"a.py": "a\n"})
    repo.write(".llmignore", "a.py\n")  # uncommitted: must not count
    assert repo.resolve().paths == ("a.py",)


def test_ignore_file_cannot_readmit_a_secret(repo):
    repo.commit(
        "readmit",
        {".llmignore": "!.env\n!**/.env*\n!*.pem\n", ".env": "TOKEN=abc\n", "k/x.pem": "pem\n"},
    )
    subject = repo.resolve()
    assert reasons(subject) == {".env": "denied_secret", "k/x.pem": "denied_secret"}
    assert "TOKEN=abc" not in subject.model_dump_json()


# Selection modes, shadow log, policy -----------------------------------------------------


def test_three_selection_modes_and_shadow_log(repo):
    repo.commit(
        "mix",
        {
            "a.py": "a\n",
            "main.zig": "const x = 1;\n",
            "LICENSE": "MIT\n",
            "infra/main.tf": "x = 1\n",
        },
    )
    content = repo.resolve(file_selection="content")
    assert content.paths == ("LICENSE", "a.py", "infra/main.tf", "main.zig")
    allow = repo.resolve(file_selection="allowlist")
    assert allow.paths == ("a.py",)
    assert reasons(allow) == dict.fromkeys(("LICENSE", "infra/main.tf", "main.zig"), "non-text")
    log = repo.root / ".council" / "selection" / "decisions.jsonl"
    assert not log.exists()

    shadow = repo.resolve(file_selection="shadow")
    assert shadow.paths == allow.paths and shadow.coverage == allow.coverage
    line = json.loads(log.read_text().splitlines()[-1])
    assert set(line) == {"ts", "snapshot_id", "candidates", "selected", "would_add", "would_drop"}
    assert line["snapshot_id"] == shadow.snapshot_resolved
    assert line["candidates"] == ["LICENSE", "a.py", "infra/main.tf", "main.zig"]
    assert line["selected"] == ["a.py"]
    assert line["would_add"] == ["LICENSE", "infra/main.tf", "main.zig"]
    assert line["would_drop"] == []

    (repo.root / ".git" / "info" / "exclude").write_text(".council/\n")
    repo.commit("py only", {"b.py": "b\n"})
    repo.resolve(file_selection="shadow")
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    empty = json.loads(lines[1])
    assert empty["would_add"] == [] and empty["would_drop"] == []


def test_shadow_log_failure_never_changes_selection(repo, tmp_path):
    repo.commit("mix", {"a.py": "a\n", "main.zig": "z\n"})
    blocker = tmp_path / "state-is-a-file"
    blocker.write_text("")
    subject = repo.resolve(file_selection="shadow", state_dir=blocker)
    assert subject.paths == ("a.py",)
    custom = tmp_path / "state"
    repo.resolve(file_selection="shadow", state_dir=custom)
    assert (custom / "selection" / "decisions.jsonl").exists()


def test_policy_fail_raises_on_unacknowledged_omissions(repo):
    repo.commit("mix", {"a.py": "a\n", "main.zig": "z\n", "img.png": b"\x00\x01"})
    with pytest.raises(CoveragePolicyError) as info:
        repo.resolve(file_selection="allowlist", coverage_policy="fail")
    assert isinstance(info.value, SubjectError)
    message = str(info.value)
    assert "main.zig (non-text)" in message and "img.png" in message
    assert [o.path for o in info.value.omitted] == ["img.png", "main.zig"]
    # binary is acknowledged by default: content mode passes the policy
    ok = repo.resolve(coverage_policy="fail")
    assert ok.coverage.policy == "fail" and reasons(ok) == {"img.png": "binary"}
    # acknowledging the reason lifts it
    assert repo.resolve(
        file_selection="allowlist",
        coverage_policy="fail",
        coverage_ack_reasons=["non-text", "binary"],
    ).paths == ("a.py",)


def test_policy_fail_ignores_unchanged_files_found_in_named_directories(repo):
    repo.commit("base", {"d/old.zig": "z\n", "d/a.py": "a\n"})
    repo.commit("touch", {"d/a.py": "a = 2\n"})
    subject = repo.resolve(["d"], file_selection="allowlist", coverage_policy="fail")
    assert subject.coverage.omitted[0].changed is False
    with pytest.raises(CoveragePolicyError, match="not_found"):
        repo.resolve(["d", "nope.py"], coverage_policy="fail")


# The secret canary -----------------------------------------------------------------------

SECRET_FILES = [
    ".env",
    ".env.local",
    "config/.ENV.production",
    "server.pem",
    "tls/private.KEY",
    "id_rsa",
    ".ssh/id_ed25519",
    ".npmrc",
    "web/.pypirc",
    ".netrc",
    ".git-credentials",
    ".aws/credentials",
    "kubeconfig",
    "clusters/prod.kubeconfig",
    "secrets.yml",
    "helm/Secrets.yaml",
    "credentials.json",
    "certs/client.p12",
    "certs/store.pfx",
    ".envs/.production/.django",
]


def test_secret_canaries_never_reach_the_subject(repo, monkeypatch):
    canaries = {path: f"CANARY-{i:03d}-9f3b1c7e" for i, path in enumerate(SECRET_FILES)}
    files: dict[str, str | bytes] = {p: f"value={c}\n" for p, c in canaries.items()}
    files.update({"src/app.py": "print('app')\n", ".env.example": "value=placeholder\n"})
    repo.commit("root", files)
    repo.commit("touch", {p: f"value={c}\nnext={c}\n" for p, c in canaries.items()})
    secret_blobs = {repo.blob("HEAD", p) for p in SECRET_FILES}
    secret_blobs |= {repo.blob("HEAD~1", p) for p in SECRET_FILES}

    requested: list[str] = []
    real_read_blobs = resolve_mod.read_blobs

    def spy(repo_root, shas, **kw):
        shas = list(shas)
        requested.extend(shas)
        return real_read_blobs(repo_root, shas, **kw)

    monkeypatch.setattr(resolve_mod, "read_blobs", spy)
    requests: list[list[str] | None] = [None, list(SECRET_FILES), ["."], ["config", ".aws"]]
    for snapshot in ("HEAD", "HEAD~1"):
        for paths in requests:
            for mode in ("content", "allowlist", "shadow"):
                subject = repo.resolve(paths, snapshot=snapshot, file_selection=mode)
                dumped = subject.model_dump_json()
                for canary in canaries.values():
                    assert canary not in dumped
                for path in SECRET_FILES:
                    if paths is None or path in paths or paths == ["."]:
                        assert reasons(subject)[path] == "denied_secret", path
    assert not secret_blobs & set(requested), "a secret blob was read"
    assert repo.blob("HEAD", ".env.example") in requested
    with pytest.raises(CoveragePolicyError) as info:
        repo.resolve(coverage_policy="fail")
    assert not any(c in str(info.value) for c in canaries.values())
    log = (repo.root / ".council" / "selection" / "decisions.jsonl").read_text()
    assert not any(c in log for c in canaries.values())


# The ignore command ----------------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """llm-council (test harness)."""

    app.command("ignore")(ignore)
    return app


def test_ignore_print_defaults():
    result = CliRunner().invoke(_app(), ["ignore", "--print-defaults"])
    assert result.exit_code == 0
    for needle in (
        ".env*",
        "*.pem",
        "id_rsa*",
        ".aws/credentials",
        "kubeconfig",
        "package-lock.json",
        "node_modules/",
        "*.min.js",
        ".llmignore",
    ):
        assert needle in result.output


def test_ignore_explain(repo):
    repo.commit(
        "base",
        {
            ".llmignore": "fixtures/\n",
            "fixtures/a.json": "{}\n",
            "src/a.py": "a\n",
            ".env": "TOKEN=explain-canary\n",
            "package-lock.json": "{}\n",
        },
    )
    runner, app = CliRunner(), _app()

    def explain(path: str, *extra: str):
        return runner.invoke(app, ["ignore", "--explain", path, "--repo", str(repo.root), *extra])

    ok = explain("src/a.py")
    assert ok.exit_code == 0 and "src/a.py: reviewed" in ok.output
    ignored = explain("fixtures/a.json")
    assert "not reviewed (ignored)" in ignored.output
    assert ".llmignore line 1: 'fixtures/'" in ignored.output
    secret = explain(".env")
    assert "denied_secret" in secret.output and "'.env*'" in secret.output
    assert "explain-canary" not in secret.output
    noise = explain("package-lock.json")
    assert "noise" in noise.output and "--file-paths" in noise.output
    absent = explain("later/yarn.lock")
    assert "not_found" in absent.output and "if it existed: omitted as noise" in absent.output
    directory = explain("src")
    assert "src/a.py: reviewed" in directory.output
    bad_rev = explain("src/a.py", "--snapshot", "no-such-rev")
    assert bad_rev.exit_code == 2 and "unknown revision 'no-such-rev'" in bad_rev.output
    bad_path = explain("../x")
    assert bad_path.exit_code == 2 and "'..'" in bad_path.output


def test_ignore_explain_uses_the_snapshot(repo):
    first = repo.commit("one", {"a.py": "a\n"})
    repo.commit("two", {".llmignore": "a.py\n"})
    result = CliRunner().invoke(
        _app(), ["ignore", "--explain", "a.py", "--repo", str(repo.root), "--snapshot", first]
    )
    assert result.exit_code == 0 and "a.py: reviewed" in result.output


def test_ignore_init(repo, tmp_path):
    repo.commit("base", {"a.py": "a\n"})
    runner, app = CliRunner(), _app()
    args = ["ignore", "--init", "--repo", str(repo.root)]
    first = runner.invoke(app, args)
    assert first.exit_code == 0
    starter = (repo.root / ".llmignore").read_text()
    assert starter.startswith("#")
    assert all(not ln.strip() or ln.startswith("#") for ln in starter.splitlines())
    (repo.root / ".llmignore").write_text("mine\n")
    again = runner.invoke(app, args)
    assert again.exit_code == 1 and "already exists" in again.output
    assert (repo.root / ".llmignore").read_text() == "mine\n"

    other = Repo(tmp_path / "other")
    other.commit("base", {".aiexclude": "x\n"})
    refused = runner.invoke(app, ["ignore", "--init", "--repo", str(other.root)])
    assert refused.exit_code == 1 and ".aiexclude" in refused.output
    assert not (other.root / ".llmignore").exists()


def test_ignore_setup_errors(tmp_path):
    runner, app = CliRunner(), _app()
    none = runner.invoke(app, ["ignore"])
    assert none.exit_code == 2 and "choose exactly one" in none.output
    both = runner.invoke(app, ["ignore", "--print-defaults", "--init"])
    assert both.exit_code == 2
    plain = runner.invoke(app, ["ignore", "--init", "--repo", str(tmp_path)])
    assert plain.exit_code == 2 and "not a git repository" in plain.output
    assert len(plain.output.strip().splitlines()) == 1
