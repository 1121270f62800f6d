"""Resolve a snapshot into a Subject: which files the council reviews, and a receipt of why.

Flow (a fixed number of git processes, whatever the file count):
`rev-parse` (root, commit) -> `cat-file commit` + `diff-tree` (changed set) -> `ls-tree`
(only for explicit paths, and the root ignore files) -> secret boundary on paths ->
`read-tree` + `check-attr` on a temporary index -> path rules -> one streamed
`cat-file --batch` for the survivors -> content rules -> Subject + CoverageReceipt.

Decisions (see also `classify` for the rule order):

- Without file paths the subject is what the commit changed against its FIRST parent (a merge
  commit yields exactly the pull request's changes; a root commit, all its files). Renames are
  detected and reviewed under the new path.
- A shallow clone whose boundary is the snapshot has no parent to diff against: without file
  paths that is a `SubjectError` saying to fetch one more commit (never "every file is new");
  with file paths it works, and every file found in a named directory counts as changed.
- A file the commit renamed or copied FROM a secret path is `denied_secret` as well.
- Deleted files have no content at the snapshot: they are listed in `expansion_warnings`, not
  as omissions, so a deletion alone never clamps a pass. A commit that only deletes files
  resolves to an empty subject (the caller turns that into `no_reviewable_content`, exit 3).
- File paths are relative to the repository root, taken literally (no globs, no pathspec
  magic). `.` means the whole tree. An absolute path, a `..` component, an empty entry or one
  with a newline or NUL is refused with `SubjectError`. A named path absent from the commit
  is omitted `not_found` (origin explicit); a named secret is `denied_secret` whether it
  exists or not.
- Directories expand from the commit's tree, in git's order. `max_files_expansion` caps the
  number of files discovered through directories (explicit files do not count). Files past
  the cap are neither read nor listed one by one: each capped directory is recorded once as
  an omission `{path: "<dir>/", reason: "truncated", origin: "explicit", changed: true}`, so
  the clamp sees that the review covers less than was asked, and `coverage.truncated`,
  `paths_truncated` and `expansion_warnings` say so.
- `changed` on a file or omission: in the commit's changed set, or named explicitly. Files
  discovered inside a named directory that the commit did not touch are `changed: false`,
  so their routine omissions never clamp.
- The changed set itself is not capped (the tier's max input size is the limit; see
  `input_too_large_message`).
- Symlinks are reviewed as their labelled link text and never followed; submodules are
  omitted as `non-text` (with a warning) because their change cannot be reviewed from here.
- Non-UTF-8 text is decoded with replacement characters; when more than 30% of the
  characters are undecodable the file is `garbage` instead.
- The repository's ignore file applies in every selection mode (the spec describes it for
  content mode; an owner's "never send this" should not lapse because someone switched to
  allowlist) and to explicitly named paths.
- `repo` may be any directory inside the work tree; paths are always relative to its root.
  File names that are not valid UTF-8 are reported with `\\xNN` escapes.
- `shadow` mode selects exactly like `allowlist` and appends one JSON line (paths only) to
  `<repo>/<state_dir>/selection/decisions.jsonl`; a failure to write it is logged and ignored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from shared.gitsnap import (
    MODE_EXECUTABLE,
    MODE_GITLINK,
    MODE_SYMLINK,
    Change,
    GitError,
    GitNotFoundError,
    changed_paths,
    check_attributes,
    commit_parents,
    ls_root,
    ls_tree,
    parent_available,
    read_blobs,
    resolve_commit,
    toplevel,
)
from shared.models import CoverageReceipt, OmittedPath
from shared.selection.classify import (
    ATTRIBUTES,
    NO_ATTRS,
    Attrs,
    BlobFacts,
    Decision,
    Mode,
    Origin,
    blob_facts,
    content_decision,
    interpret_attributes,
    path_decision,
)
from shared.selection.errors import CoveragePolicyError, SubjectError
from shared.selection.ignorefiles import IGNORE_FILE_CHAIN, IgnoreRules
from shared.selection.rules import secret_rule
from shared.settings import CouncilSettings
from shared.subject import Subject, SubjectFile
from shared.verdict import unacknowledged

log = logging.getLogger(__name__)

IGNORE_FILE_MAX_BYTES = 1 << 20
_REGULAR_MODES = ("100644", "100755")


@dataclass(slots=True)
class Candidate:
    path: str
    mode: str
    sha: str
    origin: Origin
    changed: bool
    exists: bool = True
    attrs: Attrs = NO_ATTRS
    decisions: dict[str, Decision] = field(default_factory=dict)
    content: str | None = None
    renamed_from: str | None = None  # rename/copy source in this commit, if any


@dataclass(slots=True)
class Selection:
    root: Path
    requested: str
    sha: str
    candidates: list[Candidate]
    effective: Mode
    ignore: IgnoreRules
    truncated_dirs: list[tuple[str, int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dirs_requested: bool = False


# Repository, revision and paths ----------------------------------------------------------


def open_repo(repo: Path) -> Path:
    if not repo.exists():
        raise SubjectError(f"repository path does not exist: {repo}")
    try:
        return toplevel(repo)
    except GitNotFoundError as exc:
        raise SubjectError(exc.stderr) from None
    except GitError:
        raise SubjectError(f"not a git repository: {repo}") from None


def resolve_rev(root: Path, rev: str) -> str:
    try:
        return resolve_commit(root, rev)
    except GitError:
        raise SubjectError(f"unknown revision {rev!r} in {root}: it names no commit") from None


def normalize_path(raw: str) -> str:
    """A requested path as a repository path ("" for the root). Raises SubjectError."""
    if not isinstance(raw, str) or not raw.strip():
        raise SubjectError("--file-paths entry is empty")
    if "\0" in raw or "\n" in raw or "\r" in raw:
        raise SubjectError(f"--file-paths entry {raw!r} contains a control character")
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":" and raw[0].isalpha()):
        raise SubjectError(
            f"--file-paths entry {raw!r} is absolute: give a path relative to the repository root"
        )
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SubjectError(
            f"--file-paths entry {raw!r} contains '..': paths must stay inside the repository"
        )
    return str(PurePosixPath(*parts)) if parts else ""


def shown(path: str) -> str:
    """A path fit for JSON and messages: bytes that are not UTF-8 (kept internally as
    surrogate escapes so git sees the real name) are rendered as `\\xNN`."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _dir_label(norm: str) -> str:
    return f"{norm}/" if norm else "."


# Candidates ------------------------------------------------------------------------------


def _changed_candidates(changes: Sequence[Change], warnings: list[str]) -> list[Candidate]:
    out: list[Candidate] = []
    for ch in changes:
        if ch.status == "D":
            warnings.append(f"deleted in this commit, nothing to review: {shown(ch.path)}")
            continue
        out.append(
            Candidate(ch.path, ch.mode, ch.sha, "discovered", True, renamed_from=ch.old_path)
        )
    return out


def _explicit_candidates(
    root: Path,
    sha: str,
    requested: Sequence[tuple[str, str]],
    changed: dict[str, str | None] | None,
    cap: int,
    sel: Selection,
) -> list[Candidate]:
    norms = [n for _, n in requested]
    entries = ls_tree(root, sha, None if "" in norms else sorted(set(norms)))
    by_path = {e.path: e for e in entries}
    named_files = {n for n in norms if n in by_path}
    renames: dict[str, str | None] = changed or {}
    emitted: set[str] = set()
    expanded_dirs: set[str] = set()
    out: list[Candidate] = []
    discovered = 0
    for _raw, norm in requested:
        if norm in emitted or norm in expanded_dirs:
            continue
        entry = by_path.get(norm)
        if entry is not None:
            emitted.add(norm)
            out.append(
                Candidate(
                    norm, entry.mode, entry.sha, "explicit", True, renamed_from=renames.get(norm)
                )
            )
            continue
        prefix = f"{norm}/" if norm else ""
        under = [e for e in entries if e.path.startswith(prefix)]
        if not under:
            emitted.add(norm)
            out.append(Candidate(norm, "000000", "", "explicit", True, exists=False))
            continue
        sel.dirs_requested = True
        expanded_dirs.add(norm)
        dropped = 0
        for e in under:
            if e.path in emitted or e.path in named_files:
                continue
            if discovered >= cap:
                dropped += 1
                continue
            discovered += 1
            emitted.add(e.path)
            out.append(
                Candidate(
                    e.path,
                    e.mode,
                    e.sha,
                    "discovered",
                    changed is None or e.path in changed,
                    renamed_from=renames.get(e.path),
                )
            )
        if dropped:
            label = _dir_label(norm)
            sel.truncated_dirs.append((label, dropped))
            sel.warnings.append(
                f"{label}: directory expansion capped at max_files_expansion={cap}; "
                f"{dropped} more file(s) not reviewed"
            )
    return out


def _load_ignore(root: Path, sha: str, warnings: list[str]) -> IgnoreRules:
    found = ls_root(root, sha, IGNORE_FILE_CHAIN)
    for name in IGNORE_FILE_CHAIN:
        entry = found.get(name)
        if entry is None:
            continue
        if entry.mode not in _REGULAR_MODES:
            warnings.append(f"{name} is not a regular file at this commit; skipped")
            continue
        for blob in read_blobs(root, [entry.sha], max_bytes=IGNORE_FILE_MAX_BYTES):
            if blob.data is None:
                warnings.append(f"{name} is larger than {IGNORE_FILE_MAX_BYTES} bytes; skipped")
                break
            return IgnoreRules.parse(name, blob.data.decode("utf-8", "replace"))
    return IgnoreRules()


# Classification --------------------------------------------------------------------------


def secret_decision(path: str, renamed_from: str | None = None) -> Decision | None:
    """The secret boundary. A file this commit renamed or copied FROM a secret path is denied
    too: `git mv .env settings.txt` must not send the secret under its new name."""
    rule = secret_rule(path)
    if rule is not None:
        return Decision("denied_secret", f"secret boundary pattern {rule!r}", "secret boundary")
    if renamed_from is not None:
        rule = secret_rule(renamed_from)
        if rule is not None:
            return Decision(
                "denied_secret",
                f"renamed or copied from {renamed_from!r} (secret boundary pattern {rule!r})",
                "secret boundary",
            )
    return None


def _modes(settings: CouncilSettings) -> tuple[Mode, tuple[Mode, ...]]:
    if settings.file_selection == "content":
        return "content", ("content",)
    if settings.file_selection == "shadow":
        return "allowlist", ("allowlist", "content")
    return "allowlist", ("allowlist",)


def _classify(
    sel: Selection,
    settings: CouncilSettings,
    modes: tuple[Mode, ...],
    *,
    attrs_for_missing: bool = False,
) -> None:
    root, sha = sel.root, sel.sha
    # 1. The secret boundary, on paths only: denied files are never looked at again.
    rest: list[Candidate] = []
    for c in sel.candidates:
        denied = secret_decision(c.path, c.renamed_from)
        if denied is not None:
            c.decisions = dict.fromkeys(modes, denied)
        else:
            rest.append(c)

    # 2. Attributes from the commit (one read-tree + one check-attr).
    attr_paths = [c.path for c in rest if c.exists or attrs_for_missing]
    if attr_paths:
        raw = check_attributes(root, sha, attr_paths, ATTRIBUTES)
        for c in rest:
            values = raw.get(c.path)
            if values:
                c.attrs = interpret_attributes(values)

    # 3. Path rules per mode; collect the blobs the content rules need.
    need: dict[str, list[Candidate]] = {}
    for c in rest:
        if not c.exists:
            missing = Decision("not_found", f"not present at {sha[:12]}", "git")
            c.decisions = dict.fromkeys(modes, missing)
            continue
        for mode in modes:
            d = path_decision(
                c.path,
                c.mode,
                origin=c.origin,
                attrs=c.attrs,
                ignore=sel.ignore,
                selection=mode,
                review_svg=settings.review_svg,
            )
            if d is not None:
                c.decisions[mode] = d
        if len(c.decisions) < len(modes):
            need.setdefault(c.sha, []).append(c)

    # 4. One streamed cat-file for every blob still undecided.
    max_chars = settings.max_file_chars
    seen: set[str] = set()
    for blob in read_blobs(root, list(need), max_bytes=max_chars * 4):
        users = need.get(blob.sha, [])
        seen.add(blob.sha)
        if blob.missing:
            continue
        decode = (b"\0" not in blob.head) or any(
            c.attrs.forced_text or c.mode == MODE_SYMLINK for c in users
        )
        facts: BlobFacts = blob_facts(blob.size, blob.head, blob.data, decode=decode)
        for c in users:
            for mode in modes:
                if mode in c.decisions:
                    continue
                d, text = content_decision(
                    c.mode, c.attrs, facts, max_chars=max_chars, selection=mode
                )
                c.decisions[mode] = d
                if text is not None:
                    c.content = text
    for blob_sha, users in need.items():
        for c in users:
            for mode in modes:
                c.decisions.setdefault(
                    mode,
                    Decision("not_found", "blob missing from the object store", "git"),
                )
        if blob_sha not in seen:
            log.warning("blob %s was not returned by git cat-file", blob_sha)


def _changes(root: Path, sha: str) -> list[Change] | None:
    """The first-parent diff, or None when the first parent is not in this clone."""
    parents = commit_parents(root, sha)
    if parents and not parent_available(root, parents[0]):
        return None
    return changed_paths(root, sha, parents)


def _shallow_message(sha: str) -> str:
    return (
        f"cannot compute what {sha[:12]} changed: its first parent is not in this clone "
        "(shallow clone?); fetch one more commit (actions/checkout fetch-depth: 2, or "
        "`git fetch --deepen=1`) or name the files with --file-paths"
    )


def select(
    repo: Path,
    snapshot: str,
    file_paths: Sequence[str] | None,
    *,
    settings: CouncilSettings,
) -> tuple[Selection, tuple[Mode, ...]]:
    """Resolve and classify without building the Subject (shared by resolve and explain)."""
    requested: list[tuple[str, str]] | None = None
    if file_paths is not None:
        requested = [(raw, normalize_path(raw)) for raw in file_paths]
    root = open_repo(Path(repo))
    sha = resolve_rev(root, snapshot)
    effective, modes = _modes(settings)
    try:
        changes = _changes(root, sha)
        if changes is None and requested is None:
            raise SubjectError(_shallow_message(sha))
        sel = Selection(root, snapshot, sha, [], effective, IgnoreRules())
        sel.ignore = _load_ignore(root, sha, sel.warnings)
        if requested is None:
            assert changes is not None
            sel.candidates = _changed_candidates(changes, sel.warnings)
        else:
            changed: dict[str, str | None] | None = None
            if changes is None:
                sel.warnings.append(
                    "the commit's parent is not in this clone, so its changed set is unknown: "
                    "every file found in a named directory counts as changed"
                )
            else:
                changed = {c.path: c.old_path for c in changes if c.status != "D"}
            sel.candidates = _explicit_candidates(
                root, sha, requested, changed, settings.max_files_expansion, sel
            )
        _classify(sel, settings, modes)
    except GitError as exc:
        raise SubjectError(f"git failed reading {sha[:12]} in {root}: {exc}") from None
    for c in sel.candidates:
        if c.mode == MODE_GITLINK and c.decisions[effective].reason is not None:
            sel.warnings.append(f"submodule {shown(c.path)} at {c.sha[:12]} not reviewed")
    return sel, modes


# Subject ---------------------------------------------------------------------------------


def _record_shadow(sel: Selection, settings: CouncilSettings) -> None:
    try:
        chosen = [shown(c.path) for c in sel.candidates if c.decisions["allowlist"].reviewed]
        content = {shown(c.path) for c in sel.candidates if c.decisions["content"].reviewed}
        chosen_set = set(chosen)
        line = {
            "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "snapshot_id": sel.sha,
            "candidates": [shown(c.path) for c in sel.candidates],
            "selected": chosen,
            "would_add": sorted(content - chosen_set),
            "would_drop": sorted(chosen_set - content),
        }
        state = Path(settings.state_dir)
        folder = (state if state.is_absolute() else sel.root / state) / "selection"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "decisions.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, separators=(",", ":")) + "\n")
    except Exception as exc:  # recording is soft-fail by design
        log.warning("could not record shadow selection decision: %s", exc)


def resolve_subject(
    repo: Path,
    snapshot: str,
    file_paths: Sequence[str] | None,
    *,
    settings: CouncilSettings,
) -> Subject:
    """The files to review at `snapshot`, read from the commit, with a coverage receipt.

    Raises `SubjectError` (one line) for a missing repository, an unknown revision or a bad
    path, and `CoveragePolicyError` when `coverage_policy` is `fail` and a changed or named
    file would be omitted for a reason not in `coverage_ack_reasons`.
    """
    sel, modes = select(repo, snapshot, file_paths, settings=settings)
    eff = sel.effective
    files: list[SubjectFile] = []
    omitted: list[OmittedPath] = []
    expanded: list[str] = []
    for c in sel.candidates:
        d = c.decisions[eff]
        if d.reviewed and c.content is not None:
            files.append(
                SubjectFile(
                    path=shown(c.path),
                    content=c.content,
                    executable=c.mode == MODE_EXECUTABLE,
                    changed=c.changed,
                )
            )
            if c.origin == "discovered" and file_paths is not None:
                expanded.append(shown(c.path))
        else:
            omitted.append(
                OmittedPath(
                    path=shown(c.path),
                    reason=d.reason or "not_found",
                    origin=c.origin,
                    changed=c.changed,
                )
            )
    for label, _count in sel.truncated_dirs:
        omitted.append(OmittedPath(path=label, reason="truncated", origin="explicit", changed=True))

    reviewed = tuple(f.path for f in files)
    omitted_paths = [o.path for o in omitted]
    conservation = (
        len(set(reviewed)) == len(reviewed)
        and len(set(omitted_paths)) == len(omitted_paths)
        and set(reviewed).isdisjoint(omitted_paths)
    )
    coverage = CoverageReceipt(
        requested=tuple(file_paths) if file_paths is not None else None,
        reviewed=reviewed,
        omitted=tuple(omitted),
        explicit_omitted=any(o.origin == "explicit" for o in omitted),
        truncated=bool(sel.truncated_dirs),
        conservation_ok=conservation,
        policy=settings.coverage_policy,
    )
    subject = Subject(
        repo=str(sel.root),
        snapshot_requested=snapshot,
        snapshot_resolved=sel.sha,
        files=tuple(files),
        coverage=coverage,
        expanded_paths=tuple(expanded) if sel.dirs_requested else None,
        paths_truncated=bool(sel.truncated_dirs),
        expansion_warnings=tuple(sel.warnings),
    )
    if "content" in modes and "allowlist" in modes:
        _record_shadow(sel, settings)
    if settings.coverage_policy == "fail":
        blocking = unacknowledged(omitted, settings.coverage_ack_reasons)
        if blocking:
            raise CoveragePolicyError(blocking, settings.coverage_ack_reasons)
    return subject


def input_too_large_message(subject: Subject, max_chars: int) -> str | None:
    """When the subject exceeds `max_chars`, say by how much and name the largest files."""
    total = subject.total_chars
    if total <= max_chars:
        return None
    largest = sorted(subject.files, key=lambda f: len(f.content), reverse=True)[:5]
    listing = ", ".join(f"{f.path} ({len(f.content):,})" for f in largest)
    return (
        f"subject is {total:,} characters, {total - max_chars:,} over this tier's limit of "
        f"{max_chars:,}; largest files: {listing}. Narrow --file-paths or use a tier with a "
        "larger input limit"
    )


# Explain ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PathExplanation:
    path: str
    reviewed: bool
    reason: str | None
    rule: str
    source: str
    exists: bool
    changed: bool
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Explanation:
    snapshot_requested: str
    snapshot_resolved: str
    selection: str
    ignore_file: str | None
    entries: tuple[PathExplanation, ...]
    truncated: bool = False


def explain_path(repo: Path, snapshot: str, path: str, *, settings: CouncilSettings) -> Explanation:
    """Why `path` (a file or a directory) is or is not reviewed when a commit changes it.

    Files are judged as discovered (the changed-set case); a note says when naming the file
    explicitly with --file-paths would change the outcome. A path absent from the commit is
    still run through the path rules, so the note says what would happen to it.
    """
    norm = normalize_path(path)
    root = open_repo(Path(repo))
    sha = resolve_rev(root, snapshot)
    effective, _ = _modes(settings)
    try:
        changes = _changes(root, sha) or []
        changed = {c.path: c.old_path for c in changes if c.status != "D"}
        sel = Selection(root, snapshot, sha, [], effective, IgnoreRules())
        sel.ignore = _load_ignore(root, sha, sel.warnings)
        entries = ls_tree(root, sha, [norm] if norm else None)
        exact = [e for e in entries if e.path == norm]
        chosen = exact or entries
        cap = settings.max_files_expansion
        sel.candidates = [
            Candidate(
                e.path,
                e.mode,
                e.sha,
                "discovered",
                e.path in changed,
                renamed_from=changed.get(e.path),
            )
            for e in chosen[:cap]
        ]
        if not chosen:
            sel.candidates = [Candidate(norm, "100644", "", "discovered", False, exists=False)]
        _classify(sel, settings, (effective,), attrs_for_missing=True)
    except GitError as exc:
        raise SubjectError(f"git failed reading {sha[:12]} in {root}: {exc}") from None

    out: list[PathExplanation] = []
    for c in sel.candidates:
        d = c.decisions[effective]
        note: str | None = None
        explicit = path_decision(
            c.path,
            c.mode,
            origin="explicit",
            attrs=c.attrs,
            ignore=sel.ignore,
            selection=effective,
            review_svg=settings.review_svg,
        )
        if not c.exists:
            would = path_decision(
                c.path,
                c.mode,
                origin="discovered",
                attrs=c.attrs,
                ignore=sel.ignore,
                selection=effective,
                review_svg=settings.review_svg,
            )
            if d.reason != "denied_secret":
                note = (
                    f"if it existed: omitted as {would.reason} ({would.rule})"
                    if would is not None
                    else "if it existed: reviewed when its content is text within the size cap"
                )
        elif explicit is None and (
            d.source in ("svg rule", "noise rules") or d.reason in ("generated", "vendored")
        ):
            note = "named explicitly with --file-paths it would be reviewed (content permitting)"
        out.append(
            PathExplanation(
                path=shown(c.path),
                reviewed=d.reviewed,
                reason=d.reason,
                rule=d.rule,
                source=d.source,
                exists=c.exists,
                changed=c.changed,
                note=note,
            )
        )
    return Explanation(
        snapshot_requested=snapshot,
        snapshot_resolved=sha,
        selection=settings.file_selection,
        ignore_file=sel.ignore.name,
        entries=tuple(out),
        truncated=len(chosen) > settings.max_files_expansion,
    )
