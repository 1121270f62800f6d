"""The subject of a verification: the files whose contents the council reviews."""

from __future__ import annotations

from shared.models import CoverageReceipt, Frozen


class SubjectFile(Frozen):
    path: str
    content: str
    executable: bool = False
    changed: bool = True  # in the commit's changed set (or explicitly named)


class Subject(Frozen):
    repo: str | None = None
    snapshot_requested: str
    snapshot_resolved: str
    files: tuple[SubjectFile, ...] = ()
    coverage: CoverageReceipt = CoverageReceipt()
    expanded_paths: tuple[str, ...] | None = None
    paths_truncated: bool = False
    expansion_warnings: tuple[str, ...] = ()

    @property
    def total_chars(self) -> int:
        return sum(len(f.content) for f in self.files)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)
