"""Repository-owned exclusion files, read from the snapshot, gitignore syntax.

The first of `IGNORE_FILE_CHAIN` present at the root of the commit's tree wins; the others
are not read. Only a regular file counts: a symlink or submodule with that name is skipped
(its "content" would be a link target, not patterns) and the chain moves on, with a warning.

An ignore file can only narrow what is reviewed: it runs after the secret boundary, so a
`!.env` line re-admits nothing. It applies to every path, including ones named explicitly
with `--file-paths`: the repository owner's "do not send this to an LLM" outranks the caller.
Patterns are matched case-sensitively, as git does on Linux.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pathspec is imported only when a repository has an ignore file
    from pathspec import GitIgnoreSpec

IGNORE_FILE_CHAIN: tuple[str, ...] = (
    ".llmignore",
    ".aiexclude",
    ".aiignore",
    ".cursorignore",
    ".codeiumignore",
)

STARTER_TEXT = """\
# .llmignore: files llm-council must not send to the council, gitignore syntax.
#
# Read from the commit under review (not the work tree). The first present of
# .llmignore, .aiexclude, .aiignore, .cursorignore, .codeiumignore is used.
# It can only narrow the review: secrets (.env*, *.pem, id_rsa*, ...) are always
# denied and a "!" line here cannot re-admit them. See: llm-council ignore --print-defaults
# Ask why a path is or is not reviewed: llm-council ignore --explain <path>
#
# Examples (remove the leading "# " to enable):
# fixtures/**/*.json
# docs/generated/
# *.snap
# testdata/large/
"""


@dataclass(frozen=True)
class IgnoreRules:
    """The patterns of one ignore file, or none (`name is None`)."""

    name: str | None = None
    lines: tuple[str, ...] = ()
    spec: GitIgnoreSpec | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, name: str, text: str) -> IgnoreRules:
        from pathspec import GitIgnoreSpec

        lines = tuple(text.splitlines())
        # One pattern per line (blank lines become comments) so a match maps to its line.
        spec = GitIgnoreSpec.from_lines(["#" if not ln.strip() else ln for ln in lines])
        return cls(name=name, lines=lines, spec=spec)

    def match(self, path: str) -> tuple[int, str] | None:
        """`(line number, pattern)` of the line that excludes `path`, or None."""
        if self.spec is None:
            return None
        result = self.spec.check_file(path)
        if not result.include:
            return None
        index = result.index if result.index is not None else -1
        if 0 <= index < len(self.lines):
            return index + 1, self.lines[index].strip()
        return 0, "?"
