"""Database tables (SQLModel). Tables only: HTTP schemas live in `api.schemas`, domain models
in `shared`.

`SCHEMA_VERSION` is the version of this module's layout; bump it with every change to a table
and add a step to `api.db.engine.MIGRATIONS` (see docs/api.md, "Persistence and migrations").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Index, Text
from sqlmodel import Field, SQLModel

SCHEMA_VERSION = 1


def _ts(*, nullable: bool = True, index: bool = False) -> Any:
    return Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=nullable, index=index),
    )


class VerificationRow(SQLModel, table=True):
    """One verification: what was asked, where it stands, and its payload once done."""

    __tablename__ = "verifications"
    __table_args__ = (Index("ix_verifications_verdict_tier", "verdict", "tier"),)

    id: str = Field(primary_key=True, max_length=64)
    snapshot_requested: str = Field(max_length=256)
    snapshot_resolved: str | None = Field(default=None, max_length=256, index=True)
    repo: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    tier: str = Field(max_length=16, index=True)
    #: queued | stage1 | stage2 | chairman | done | error
    state: str = Field(default="queued", max_length=16, index=True)
    verdict: str | None = Field(default=None, max_length=16, index=True)
    exit_code: int | None = None
    confidence: float | None = None
    unclear_reason: str | None = Field(default=None, max_length=32)
    error: str | None = Field(default=None, max_length=64)
    #: the service's own failure message when state is `error` (no verdict was formed)
    failure: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    runner: str | None = Field(default=None, max_length=16)
    #: api | mcp | transcript (a run found in a transcript folder, e.g. from `gate`)
    source: str = Field(default="api", max_length=16)
    timing: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    payload: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    transcript_location: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, index=True)
    )
    deadline_at: datetime | None = _ts()
    updated_at: datetime | None = _ts()
    finished_at: datetime | None = _ts()


class DispositionRow(SQLModel, table=True):
    """A person's accept/reject of a verification, or of one of its findings."""

    __tablename__ = "dispositions"

    id: int | None = Field(default=None, primary_key=True)
    verification_id: str = Field(foreign_key="verifications.id", max_length=64, index=True)
    #: index into the payload's `findings`; None means the verification as a whole
    finding_index: int | None = None
    #: sha256 of the finding's severity, location and description, stable across re-renders
    finding_fingerprint: str | None = Field(default=None, max_length=64)
    decision: str = Field(max_length=16)  # accept | reject
    author: str | None = Field(default=None, max_length=200)
    note: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class SchemaVersionRow(SQLModel, table=True):
    """A single row: the layout version the database was created or migrated to."""

    __tablename__ = "llm_council_schema_version"

    id: int = Field(default=1, primary_key=True)
    version: int
    applied_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
