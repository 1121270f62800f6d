"""Errors raised while resolving a subject. Messages are one line and carry paths, never
file contents."""

from __future__ import annotations

from collections.abc import Sequence

from shared.models import OmittedPath


class SubjectError(ValueError):
    """The subject could not be resolved: not a repository, unknown revision, bad path."""


class CoveragePolicyError(SubjectError):
    """`coverage_policy=fail` and a changed or named file was omitted for an unacknowledged
    reason. `omitted` holds those omissions (paths and reasons only)."""

    def __init__(self, omitted: Sequence[OmittedPath], ack_reasons: Sequence[str]) -> None:
        self.omitted = tuple(omitted)
        shown = ", ".join(f"{o.path} ({o.reason})" for o in self.omitted[:20])
        more = f" and {len(self.omitted) - 20} more" if len(self.omitted) > 20 else ""
        acked = ",".join(ack_reasons) or "none"
        super().__init__(
            f"coverage policy 'fail': {len(self.omitted)} changed or named file(s) would not "
            f"be reviewed: {shown}{more} (acknowledged reasons: {acked}; set "
            "LLM_COUNCIL_COVERAGE_ACK_REASONS or LLM_COUNCIL_COVERAGE_POLICY to change this)"
        )
