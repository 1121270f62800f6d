"""The layered filter, as pure functions of a path, its git mode, its attributes and its blob.

Order (the first rule that applies decides, and its reason is recorded):

1. secret boundary -> `denied_secret` (path only; the blob is never read)
2. the repository's ignore file -> `ignored` (also for paths named explicitly)
3. submodule (mode 160000) -> `non-text`: its content lives in another repository, so the
   council cannot review the change it brings; reported (and clamped) rather than passed.
4. `.gitattributes` `linguist-generated` -> `generated`, `linguist-vendored` -> `vendored`
   (discovered files only; see "explicit" below)
5. noise (lockfiles, dependency folders, minified bundles) -> `noise` (discovered only)
6. symlink (mode 120000) -> reviewed as its link text, labelled, never followed: a
   demanding CI user wants a new `static/passwd -> /etc/passwd` link in front of the
   reviewers, not silently dropped, and following it would read outside the snapshot.
7. `.svg` -> `binary` (an image asset) in content mode unless `review_svg`; discovered only
8. `.gitattributes` `binary`, `-text` or `-diff` -> `binary` (no blob read)
9. allowlist/shadow mode: extension not on `TEXT_EXTENSIONS` -> `non-text`
10. blob: a NUL in the first 8000 bytes -> `binary` (unless the attributes force `text` or
    `diff`); more than `GARBAGE_RATIO` of the characters undecodable as UTF-8 -> `garbage`
    (otherwise decoded with U+FFFD replacement, a leading BOM dropped); more than
    `max_file_chars` characters -> `too_large`.

Explicitly named files skip the "probably not worth tokens" heuristics (4, 5, 7): the caller
asked for that file. The safety and feasibility rules (secrets, ignore file, submodule,
binary, allowlist, size) still apply to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.gitsnap import MODE_GITLINK, MODE_SYMLINK, TEXT_PROBE_BYTES
from shared.selection.ignorefiles import IgnoreRules
from shared.selection.rules import allowlisted, extension_of, is_svg, noise_rule, secret_rule

Mode = Literal["content", "allowlist"]
Origin = Literal["explicit", "discovered"]

ATTRIBUTES: tuple[str, ...] = ("binary", "text", "diff", "linguist-generated", "linguist-vendored")
#: Share of undecodable characters above which a text blob is `garbage` rather than text.
GARBAGE_RATIO = 0.3
SYMLINK_TEXT_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class Attrs:
    binary: str | None = None  # the rule that marks it binary: "binary", "-text", "-diff"
    forced_text: bool = False  # `text` or `diff` explicitly set
    generated: bool | None = None  # True set/true, False unset/false, None unspecified
    vendored: bool | None = None


NO_ATTRS = Attrs()


def _flag(value: str | None) -> bool | None:
    if value in ("set", "true"):
        return True
    if value in ("unset", "false"):
        return False
    return None


def interpret_attributes(values: dict[str, str]) -> Attrs:
    """Read git check-attr values (`set`/`unset`/`unspecified`/value) into `Attrs`."""
    binary: str | None = None
    if values.get("binary") == "set":
        binary = "binary"
    elif values.get("text") == "unset":
        binary = "-text"
    elif values.get("diff") == "unset":
        binary = "-diff"
    forced = values.get("text") == "set" or values.get("diff") == "set"
    return Attrs(
        binary=binary,
        forced_text=forced and binary is None,
        generated=_flag(values.get("linguist-generated")),
        vendored=_flag(values.get("linguist-vendored")),
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """`reason` None means reviewed; `rule` says which rule decided, for humans."""

    reason: str | None
    rule: str
    source: str = ""

    @property
    def reviewed(self) -> bool:
        return self.reason is None


def path_decision(
    path: str,
    mode: str,
    *,
    origin: Origin,
    attrs: Attrs,
    ignore: IgnoreRules,
    selection: Mode,
    review_svg: bool,
) -> Decision | None:
    """Rules 1-9. None: the path passes and the blob decides (rule 10)."""
    rule = secret_rule(path)
    if rule is not None:
        return Decision("denied_secret", f"secret boundary pattern {rule!r}", "secret boundary")
    hit = ignore.match(path)
    if hit is not None and ignore.name:
        line, pattern = hit
        return Decision("ignored", f"{ignore.name} line {line}: {pattern!r}", ignore.name)
    if mode == MODE_GITLINK:
        return Decision(
            "non-text", "submodule (mode 160000): its content is in another repository", "git"
        )
    discovered = origin == "discovered"
    if discovered and attrs.generated:
        return Decision("generated", "linguist-generated", ".gitattributes")
    if discovered and attrs.vendored:
        return Decision("vendored", "linguist-vendored", ".gitattributes")
    if discovered:
        noise = noise_rule(path)
        if noise is not None:
            kind, pattern = noise
            override = attrs.vendored if kind == "dependency" else attrs.generated
            if override is not False:
                return Decision("noise", f"{kind} rule {pattern!r}", "noise rules")
    if mode == MODE_SYMLINK:
        return None
    if discovered and selection == "content" and is_svg(path) and not review_svg:
        return Decision(
            "binary",
            "*.svg is treated as an image (LLM_COUNCIL_REVIEW_SVG=true reviews it)",
            "svg rule",
        )
    if attrs.binary is not None:
        return Decision("binary", f"attribute {attrs.binary}", ".gitattributes")
    if selection == "allowlist" and not allowlisted(path):
        ext = extension_of(path) or "(none)"
        return Decision(
            "non-text", f"extension {ext} is not on the allowlist (TEXT_EXTENSIONS)", "allowlist"
        )
    return None


@dataclass(frozen=True, slots=True)
class BlobFacts:
    size: int
    has_nul: bool
    text: str | None  # None when the blob was too large to keep or was not decoded
    bad_ratio: float = 0.0


def blob_facts(size: int, head: bytes, data: bytes | None, *, decode: bool = True) -> BlobFacts:
    """Measure a blob: NUL in the first 8000 bytes, and its UTF-8 text when kept."""
    has_nul = b"\0" in head[:TEXT_PROBE_BYTES]
    if data is None or not decode:
        return BlobFacts(size, has_nul, None)
    try:
        text = data.decode("utf-8")
        bad = 0.0
    except UnicodeDecodeError:
        text = data.decode("utf-8", "replace")
        bad = text.count("\ufffd") / max(1, len(text))
    if text.startswith("\ufeff"):
        text = text[1:]
    return BlobFacts(size, has_nul, text, bad)


def symlink_text(target: str) -> str:
    return (
        "[symbolic link, git mode 120000; not followed, this is the link's target path, "
        f"not file content]\n-> {target[:SYMLINK_TEXT_LIMIT]}\n"
    )


def content_decision(
    mode: str, attrs: Attrs, facts: BlobFacts, *, max_chars: int, selection: Mode
) -> tuple[Decision, str | None]:
    """Rule 10: the blob decides. Returns the decision and, when reviewed, the content."""
    if mode == MODE_SYMLINK:
        target = facts.text if facts.text is not None else "(unreadable link target)"
        return Decision(None, "symlink reviewed as its link text", "git"), symlink_text(target)
    if facts.has_nul and not attrs.forced_text:
        return Decision("binary", "NUL byte in the first 8000 bytes", "content"), None
    if facts.text is None:
        return (
            Decision("too_large", f"{facts.size} bytes, over {max_chars} characters", "size"),
            None,
        )
    if facts.bad_ratio > GARBAGE_RATIO:
        return (
            Decision(
                "garbage", f"{facts.bad_ratio:.0%} of characters are not valid UTF-8", "content"
            ),
            None,
        )
    if len(facts.text) > max_chars:
        return (
            Decision(
                "too_large",
                f"{len(facts.text)} characters, over max_file_chars={max_chars}",
                "size",
            ),
            None,
        )
    why = (
        "text (no NUL byte in the first 8000 bytes)"
        if selection == "content"
        else "extension on the allowlist, text content"
    )
    if attrs.forced_text and facts.has_nul:
        why = "text forced by .gitattributes"
    return Decision(None, why, "content"), facts.text
