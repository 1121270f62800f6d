"""Git plumbing for reading a snapshot (a commit), never the work tree.

Every call goes through `run_git` with an argument list (no shell string, no interpolation),
so a revision or path can never be read as shell syntax. A revision that starts with `-` is
refused before it reaches git, so it cannot be read as an option either.

What this module offers, each a small number of git processes regardless of file count:

- `toplevel` / `resolve_commit`: the repository root and the full sha a revision names.
- `commit_parents` and `changed_paths`: the first-parent diff (`diff-tree -r -z -M`), so a merge
  commit yields exactly what it brought in relative to its first parent (a pull request's
  changes), and a root commit yields all its files. Renames are detected (`-M`, git's default
  50% similarity) and reported under their new path with the old one kept. Parents are read
  from the commit object (`cat-file commit`), so the boundary commit of a shallow clone is
  not mistaken for a root commit (`parent_available` tells whether the parent is present).
- `ls_tree`: recursive listing of the commit's tree, optionally limited to literal paths.
- `read_blobs`: one `git cat-file --batch` process for any number of blobs, streamed: the
  caller sees each blob as it arrives and oversized blobs are never held whole in memory
  (only their first bytes, for the NUL test).
- `check_attributes`: `.gitattributes` evaluated from the commit itself. git 2.39 has no
  `--attr-source`, so the commit's tree is loaded into a throwaway index
  (`GIT_INDEX_FILE=<tmp> git read-tree <sha>`) and `git check-attr --cached --stdin -z` reads
  the attributes files from that index only. The user's global attributes file and the
  system one are switched off (`core.attributesFile`, `GIT_ATTR_NOSYSTEM`) so the answer
  depends on the snapshot; `$GIT_DIR/info/attributes`, the clone's deliberate local
  override, still applies as git documents.

Environment variables that would redirect git to another repository or index (as set inside
git hooks) are removed from the child environment.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Environment variables that would make git look at another repository, index or pathspec
#: mode than the one we ask for.
_SCRUBBED_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_PREFIX",
    "GIT_LITERAL_PATHSPECS",
    "GIT_GLOB_PATHSPECS",
    "GIT_NOGLOB_PATHSPECS",
    "GIT_ICASE_PATHSPECS",
    "GIT_EXTERNAL_DIFF",
)

MODE_SYMLINK = "120000"
MODE_GITLINK = "160000"
MODE_EXECUTABLE = "100755"

#: git's own text heuristic looks at this many leading bytes for a NUL.
TEXT_PROBE_BYTES = 8000


class GitError(RuntimeError):
    """A git command failed. `stderr` keeps git's message (never file contents)."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        self.git_args = tuple(args)
        self.returncode = returncode
        self.stderr = stderr.strip()
        first = self.stderr.splitlines()[0] if self.stderr else f"exit status {returncode}"
        super().__init__(f"git {' '.join(args[:2])} failed: {first}")


class GitNotFoundError(GitError):
    def __init__(self) -> None:
        super().__init__(("--version",), 127, "git executable not found on PATH")


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env.update(
        {
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "LC_ALL": "C",
            "LANGUAGE": "C",
        }
    )
    if extra:
        env.update(extra)
    return env


def _base(repo: Path) -> list[str]:
    return ["git", "-C", str(repo), "-c", "core.quotePath=false"]


def run_git(
    repo: Path,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> bytes:
    """Run `git -C repo <args>` and return stdout; raise `GitError` on a non-zero exit."""
    cmd = [*_base(repo), *args]
    try:
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            env=git_env(env),
            check=False,
        )
    except FileNotFoundError:
        raise GitNotFoundError() from None
    if proc.returncode != 0:
        raise GitError(args, proc.returncode, proc.stderr.decode("utf-8", "replace"))
    return proc.stdout


# Repository and revisions --------------------------------------------------------------


def toplevel(repo: Path) -> Path:
    """The work-tree root containing `repo` (or `repo` itself for a bare repository)."""
    try:
        out = run_git(repo, "rev-parse", "--show-toplevel")
    except GitError:
        bare = run_git(repo, "rev-parse", "--is-bare-repository").decode().strip()
        if bare == "true":
            return repo
        raise
    return Path(out.decode("utf-8", "surrogateescape").strip())


def resolve_commit(repo: Path, rev: str) -> str:
    """The full sha of the commit `rev` names. Raises `GitError` if it names no commit."""
    if not rev or rev.startswith("-") or "\n" in rev or "\0" in rev:
        raise GitError(("rev-parse", rev), 128, f"invalid revision {rev!r}")
    out = run_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    return out.decode().strip()


def commit_parents(repo: Path, sha: str) -> tuple[str, ...]:
    """The parents recorded in the commit object itself.

    Read from the object, not from `rev-list`, because a shallow clone grafts its boundary
    commits to look parentless: treating such a commit as a root would make every file of
    the repository "changed". `parent_available` tells whether a parent can be diffed.
    """
    out = run_git(repo, "cat-file", "commit", sha)
    header = out.split(b"\n\n", 1)[0]
    return tuple(
        line.split(b" ", 1)[1].decode().strip()
        for line in header.split(b"\n")
        if line.startswith(b"parent ")
    )


def parent_available(repo: Path, parent: str) -> bool:
    try:
        run_git(repo, "cat-file", "-e", f"{parent}^{{commit}}")
    except GitError:
        return False
    return True


# Trees and diffs -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeEntry:
    path: str
    mode: str
    sha: str


@dataclass(frozen=True, slots=True)
class Change:
    status: str  # A M D T R C (score stripped)
    path: str  # the path at the snapshot (the new path of a rename)
    mode: str  # mode at the snapshot ("000000" when deleted)
    sha: str  # blob at the snapshot (zeros when deleted)
    old_path: str | None = None  # the source of a rename or copy


def _decode_path(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def changed_paths(repo: Path, sha: str, parents: Sequence[str] | None = None) -> list[Change]:
    """What `sha` changed against its first parent; every file for a root commit."""
    if parents is None:
        parents = commit_parents(repo, sha)
    if parents:
        args = ["diff-tree", "-r", "-z", "--raw", "--no-commit-id", "-M", parents[0], sha]
    else:
        args = ["diff-tree", "-r", "-z", "--raw", "--no-commit-id", "--root", sha]
    out = run_git(repo, *args)
    fields = out.split(b"\0")
    changes: list[Change] = []
    i = 0
    while i < len(fields):
        meta = fields[i]
        if not meta:
            i += 1
            continue
        # ":<old mode> <new mode> <old sha> <new sha> <status>[score]"
        parts = meta.lstrip(b":").split(b" ")
        new_mode, new_sha, status = parts[1].decode(), parts[3].decode(), parts[4].decode()[:1]
        if status in ("R", "C"):
            old_path, new_path = _decode_path(fields[i + 1]), _decode_path(fields[i + 2])
            changes.append(Change(status, new_path, new_mode, new_sha, old_path))
            i += 3
        else:
            changes.append(Change(status, _decode_path(fields[i + 1]), new_mode, new_sha))
            i += 2
    return changes


def ls_tree(repo: Path, sha: str, paths: Sequence[str] | None = None) -> list[TreeEntry]:
    """Recursive listing of `sha`'s tree (blobs, symlinks, submodules), in git's order.

    `paths` limit the listing to those literal paths (a file, or a directory's contents);
    pathspec magic and globs are switched off. `None` or an empty path lists everything.
    """
    args = ["ls-tree", "-r", "-z", "--full-tree", sha]
    if paths and all(paths):
        args += ["--", *paths]
    out = run_git(repo, *args, env={"GIT_LITERAL_PATHSPECS": "1"})
    entries: list[TreeEntry] = []
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, _, raw_path = rec.partition(b"\t")
        mode, _kind, obj = meta.decode().split(" ")
        entries.append(TreeEntry(_decode_path(raw_path), mode, obj))
    return entries


def ls_root(repo: Path, sha: str, names: Sequence[str]) -> dict[str, TreeEntry]:
    """Entries named `names` at the root of `sha`'s tree (not recursive)."""
    out = run_git(
        repo, "ls-tree", "-z", "--full-tree", sha, "--", *names, env={"GIT_LITERAL_PATHSPECS": "1"}
    )
    found: dict[str, TreeEntry] = {}
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, _, raw_path = rec.partition(b"\t")
        mode, _kind, obj = meta.decode().split(" ")
        path = _decode_path(raw_path)
        found[path] = TreeEntry(path, mode, obj)
    return found


# Blob contents ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Blob:
    """One answer from `cat-file --batch`.

    `data` is the whole blob when its size is at most the caller's `max_bytes`; otherwise it
    is None and only `head` (the first `TEXT_PROBE_BYTES`) was kept.
    """

    sha: str
    size: int
    head: bytes
    data: bytes | None
    missing: bool = False


def read_blobs(repo: Path, shas: Iterable[str], *, max_bytes: int) -> Iterator[Blob]:
    """Stream the blobs `shas` from one `git cat-file --batch` process, in request order.

    Requests are written by a helper thread while this generator reads, so neither pipe can
    fill up and deadlock however many blobs are asked for.
    """
    wanted = list(shas)
    if not wanted:
        return
    try:
        proc = subprocess.Popen(
            [*_base(repo), "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=git_env(),
        )
    except FileNotFoundError:
        raise GitNotFoundError() from None
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def feed() -> None:
        try:
            stdin.write(b"".join(s.encode() + b"\n" for s in wanted))
        except (BrokenPipeError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    writer = threading.Thread(target=feed, name="cat-file-feed", daemon=True)
    writer.start()
    try:
        for requested in wanted:
            header = stdout.readline()
            if not header:
                raise GitError(("cat-file", "--batch"), proc.poll() or 1, "unexpected end")
            parts = header.split()
            if len(parts) != 3:  # "<name> missing" / "<name> ambiguous"
                yield Blob(requested, 0, b"", None, missing=True)
                continue
            obj, size = parts[0].decode(), int(parts[2])
            if size <= max_bytes:
                data = stdout.read(size)
                stdout.read(1)  # the newline after the contents
                yield Blob(obj, size, data[:TEXT_PROBE_BYTES], data)
                continue
            head = stdout.read(min(size, TEXT_PROBE_BYTES))
            remaining = size - len(head) + 1
            while remaining > 0:  # discard without keeping it
                chunk = stdout.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                remaining -= len(chunk)
            yield Blob(obj, size, head, None)
    finally:
        stdout.close()
        writer.join(timeout=5)
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# Attributes from the snapshot ------------------------------------------------------------


def check_attributes(
    repo: Path, sha: str, paths: Sequence[str], attributes: Sequence[str]
) -> dict[str, dict[str, str]]:
    """`{path: {attribute: value}}` as the commit's own `.gitattributes` define them.

    Values are git's: `set`, `unset`, `unspecified` or the assigned string.
    """
    if not paths:
        return {}
    with tempfile.TemporaryDirectory(prefix="llm-council-attr-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_ATTR_NOSYSTEM": "1"}
        run_git(repo, "read-tree", sha, env=env)
        out = run_git(
            repo,
            "-c",
            f"core.attributesFile={os.devnull}",
            "check-attr",
            "--cached",
            "--stdin",
            "-z",
            *attributes,
            input=b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths),
            env=env,
        )
    result: dict[str, dict[str, str]] = {}
    fields = out.split(b"\0")
    for i in range(0, len(fields) - 2, 3):
        path = _decode_path(fields[i])
        result.setdefault(path, {})[fields[i + 1].decode()] = fields[i + 2].decode()
    return result
