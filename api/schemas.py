"""Surface schemas: what the HTTP API (and the MCP tools, as JSON) accept and answer.

Domain models live in `shared`, database tables in `api.db.tables`; these are the shapes on
the wire. The verification payload itself is `shared.response.VerifyResponse`, answered as
built by the verdict engine: surfaces render it and never recompute it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.response import VerifyResponse
from shared.tiers import Tier

MAX_TARGET_PATHS = 1000
MAX_BUNDLE_FILES = 5000
MAX_PATH_CHARS = 4096

StateName = Literal["queued", "stage1", "stage2", "chairman", "done", "error"]


def is_unicode(value: str) -> bool:
    """False for a string holding a lone surrogate (JSON allows it; UTF-8 does not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BundleFile(_Strict):
    """One file of an inline bundle: its repository path, text content and executable bit."""

    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    content: str
    executable: bool = False


class InlineBundle(_Strict):
    """Files a client read from its own checkout of `snapshot_id`.

    The client should already have applied the secret boundary; the server applies it again
    and omits (never reviews, never stores) any secret path it still finds.
    """

    files: list[BundleFile] = Field(min_length=1, max_length=MAX_BUNDLE_FILES)


class VerifyBody(_Strict):
    """`POST /v1/council/verify`. Exactly one of `repo` and `bundle` names the subject."""

    snapshot_id: str = Field(
        default="HEAD",
        min_length=1,
        max_length=256,
        description="Commit to verify (any git revision naming a commit in `repo`); for a "
        "bundle, the commit the client read its files from (recorded as given).",
    )
    target_paths: list[str] | None = Field(
        default=None,
        max_length=MAX_TARGET_PATHS,
        description="Files or directories to review, relative to the repository root. "
        "Default: what the commit changed against its first parent (repo), or every "
        "bundle file.",
    )
    tier: Tier | None = Field(
        default=None, description="quick | balanced | high | reasoning (default: the server's)."
    )
    rubric_focus: list[str] = Field(default_factory=list, max_length=20)
    confidence_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    repo: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH_CHARS,
        description="A repository on the server: an absolute path under one of "
        "LLM_COUNCIL_REPO_ROOTS, or a path relative to the first root.",
    )
    bundle: InlineBundle | None = None
    wait: bool = Field(
        default=True,
        description="true: answer with the payload when done (at the latest at the tier's "
        "verify deadline); false: answer 202 with the id and a status URL at once.",
    )
    shuffle_seed: int | None = Field(default=None, ge=0, lt=2**63)

    @field_validator("target_paths")
    @classmethod
    def _path_lengths(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            for i, p in enumerate(v):
                if len(p) > MAX_PATH_CHARS:
                    raise ValueError(f"target_paths[{i}] is longer than {MAX_PATH_CHARS}")
        return v

    @field_validator("rubric_focus")
    @classmethod
    def _focus_lengths(cls, v: list[str]) -> list[str]:
        for i, p in enumerate(v):
            if len(p) > 200:
                raise ValueError(f"rubric_focus[{i}] is longer than 200 characters")
        return v

    @model_validator(mode="after")
    def _valid_unicode(self) -> VerifyBody:
        texts: list[tuple[str, str]] = [("snapshot_id", self.snapshot_id)]
        texts += [(f"target_paths[{i}]", p) for i, p in enumerate(self.target_paths or ())]
        texts += [(f"rubric_focus[{i}]", p) for i, p in enumerate(self.rubric_focus)]
        if self.repo is not None:
            texts.append(("repo", self.repo))
        for i, f in enumerate(self.bundle.files if self.bundle else ()):
            texts += [
                (f"bundle.files[{i}].path", f.path),
                (f"bundle.files[{i}].content", f.content),
            ]
        for name, value in texts:
            if not is_unicode(value):
                raise ValueError(f"{name} is not valid Unicode (it holds a lone surrogate)")
        return self

    @model_validator(mode="after")
    def _one_subject(self) -> VerifyBody:
        if (self.repo is None) == (self.bundle is None):
            raise ValueError(
                "give exactly one of 'repo' (a repository on the server) and 'bundle' "
                "(inline files)"
            )
        return self


class StageProgressOut(BaseModel):
    done: int = 0
    total: int = 0


class ProgressOut(BaseModel):
    stage1: StageProgressOut = StageProgressOut()
    stage2: StageProgressOut = StageProgressOut()
    chairman: StageProgressOut = StageProgressOut()


class VerificationSummary(BaseModel):
    verification_id: str
    state: StateName
    tier: str
    snapshot_requested: str
    snapshot_resolved: str | None = None
    repo: str | None = None
    verdict: str | None = None
    exit_code: int | None = None
    confidence: float | None = None
    unclear_reason: str | None = None
    error: str | None = None
    failure: str | None = Field(
        default=None, description="Why the service could not form a verdict (state `error`)."
    )
    runner: str | None = None
    source: str | None = None
    created_at: datetime
    deadline_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    transcript_location: str | None = None
    status_url: str
    transcript_url: str


class VerificationStatus(VerificationSummary):
    """A verification's state, stage progress, and its payload once done."""

    progress: ProgressOut | None = None
    payload: VerifyResponse | None = None


class VerificationAccepted(BaseModel):
    """202 for `wait=false` (or a `wait=true` run still going at its deadline)."""

    verification_id: str
    state: StateName
    tier: str
    created_at: datetime
    deadline_at: datetime
    verify_deadline_s: float
    status_url: str
    transcript_url: str


class VerificationPage(BaseModel):
    items: list[VerificationSummary]
    total: int
    limit: int
    offset: int
    next_offset: int | None = None


class TranscriptFileOut(BaseModel):
    name: str
    size: int
    content: Any = Field(description="Parsed JSON for .json files, text otherwise.")


class IntegrityOut(BaseModel):
    checked: bool
    ok: bool | None = None
    problems: list[str] = Field(default_factory=list)


class TranscriptOut(BaseModel):
    verification_id: str
    location: str
    files: list[TranscriptFileOut]
    integrity: IntegrityOut


class DispositionIn(_Strict):
    """A person's accept/reject of a verification, or of one finding (by index)."""

    decision: Literal["accept", "reject"]
    finding_index: int | None = Field(default=None, ge=0, lt=10_000)
    author: str | None = Field(default=None, max_length=200)
    note: str | None = Field(default=None, max_length=4000)

    @field_validator("author", "note")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        if v is not None and (not is_unicode(v) or "\x00" in v):
            raise ValueError("must be valid Unicode text without NUL characters")
        return v


class DispositionOut(BaseModel):
    id: int
    verification_id: str
    decision: str
    finding_index: int | None = None
    finding_fingerprint: str | None = None
    author: str | None = None
    note: str | None = None
    created_at: datetime


class CheckOut(BaseModel):
    ok: bool
    detail: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, CheckOut]


class ErrorOut(BaseModel):
    detail: str
    field: str | None = None
