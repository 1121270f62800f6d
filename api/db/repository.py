"""Reading and writing verification rows, and syncing the index from transcript folders.

The transcript folder (`.council/logs/<UTC time>-<id>/`, sealed by `integrity.json`) is the
record of a run; the database is an index over those records plus the runs this service is
still carrying out. Runs started by `llm-council gate` never touch the database (the gate's
embedded path stays free of SQL imports); `ingest_transcripts` adds them the next time
`history`, `audit` or the list endpoint looks, idempotently (upsert by verification id). A
folder whose seal does not verify, or whose payload does not re-derive its verdict, is not
indexed: it is reported, and `audit --validate` says what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from api.db.engine import ping
from api.db.tables import DispositionRow, VerificationRow
from shared import transcript
from shared.pipeline import RunPlan
from shared.response import VerifyResponse

log = logging.getLogger(__name__)

ACTIVE_STATES = ("queued", "stage1", "stage2", "chairman")


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every stored time is UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def now_utc() -> datetime:
    return datetime.now(UTC)


def finding_fingerprint(finding: dict[str, Any]) -> str:
    key = "\0".join(
        str(finding.get(k) or "") for k in ("severity", "location", "description")
    ).encode()
    return hashlib.sha256(key).hexdigest()


@dataclass(frozen=True)
class VerificationFilter:
    verdict: str | None = None
    tier: str | None = None
    state: str | None = None
    #: a snapshot as requested, the resolved sha, or a prefix (4+ characters) of the sha
    snapshot: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (folder, why)


class VerificationStore:
    """All SQL lives here; callers get detached rows (attributes stay readable)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def ping(self) -> None:
        ping(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    # Writes ---------------------------------------------------------------------------
    def record_planned(self, plan: RunPlan, *, source: str, runner: str) -> None:
        row = VerificationRow(
            id=plan.verification_id,
            snapshot_requested=plan.snapshot.requested[:256],
            snapshot_resolved=plan.snapshot.resolved[:256],
            repo=plan.snapshot.repo,
            tier=plan.tier.value,
            state="queued",
            source=source,
            runner=runner,
            transcript_location=plan.transcript_path,
            created_at=utc(plan.created_at),
            deadline_at=utc(plan.deadline_at),
            updated_at=now_utc(),
        )
        with self._session() as s:
            if s.get(VerificationRow, row.id) is None:
                s.add(row)
                try:
                    s.commit()
                except IntegrityError:
                    s.rollback()

    def record_progress(self, verification_id: str, state: str) -> None:
        with self._session() as s:
            row = s.get(VerificationRow, verification_id)
            if row is None or row.state in ("done", "error") or row.state == state:
                return
            row.state = state
            row.updated_at = now_utc()
            s.add(row)
            s.commit()

    def record_failure(self, verification_id: str, message: str) -> None:
        """The service could not carry the run to a verdict (no payload exists)."""
        with self._session() as s:
            row = s.get(VerificationRow, verification_id)
            if row is None or row.state == "done":
                return
            row.state = "error"
            row.failure = message[:2000]
            row.updated_at = row.finished_at = now_utc()
            s.add(row)
            s.commit()

    def record_payload(
        self,
        payload: VerifyResponse,
        *,
        source: str,
        created_at: float | None = None,
        deadline_at: float | None = None,
        finished_at: datetime | None = None,
        transcript_location: str | None = None,
    ) -> VerificationRow:
        """Upsert the finished run (idempotent: the same payload twice leaves one row)."""
        for attempt in range(2):
            with self._session() as s:
                row = s.get(VerificationRow, payload.verification_id)
                if row is None:
                    snap = payload.snapshot
                    row = VerificationRow(
                        id=payload.verification_id,
                        snapshot_requested=(snap.requested if snap else "")[:256],
                        snapshot_resolved=(snap.resolved[:256] if snap else None),
                        repo=snap.repo if snap else None,
                        tier=payload.tier.value,
                        source=source,
                        created_at=utc(created_at) if created_at else finished_at or now_utc(),
                        deadline_at=utc(deadline_at) if deadline_at else None,
                    )
                _apply_payload(row, payload, finished_at or now_utc())
                if transcript_location:
                    row.transcript_location = transcript_location
                s.add(row)
                try:
                    s.commit()
                    return row
                except IntegrityError:
                    s.rollback()
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    def add_disposition(
        self,
        verification_id: str,
        *,
        decision: str,
        finding_index: int | None,
        finding_fingerprint: str | None,
        author: str | None,
        note: str | None,
    ) -> DispositionRow:
        row = DispositionRow(
            verification_id=verification_id,
            finding_index=finding_index,
            finding_fingerprint=finding_fingerprint,
            decision=decision,
            author=author,
            note=note,
            created_at=now_utc(),
        )
        with self._session() as s:
            s.add(row)
            s.commit()
            s.refresh(row)
            return row

    # Reads ----------------------------------------------------------------------------
    def get(self, verification_id: str) -> VerificationRow | None:
        with self._session() as s:
            return s.get(VerificationRow, verification_id)

    def search(
        self, flt: VerificationFilter, *, limit: int = 50, offset: int = 0
    ) -> tuple[list[VerificationRow], int]:
        conds: list[Any] = []
        if flt.verdict:
            conds.append(col(VerificationRow.verdict) == flt.verdict)
        if flt.tier:
            conds.append(col(VerificationRow.tier) == flt.tier)
        if flt.state:
            conds.append(col(VerificationRow.state) == flt.state)
        if flt.snapshot:
            snap = flt.snapshot
            options = [
                col(VerificationRow.snapshot_requested) == snap,
                col(VerificationRow.snapshot_resolved) == snap,
            ]
            if len(snap) >= 4:
                options.append(
                    col(VerificationRow.snapshot_resolved).startswith(snap, autoescape=True)
                )
            conds.append(or_(*options))
        if flt.since:
            conds.append(col(VerificationRow.created_at) >= as_utc(flt.since))
        if flt.until:
            conds.append(col(VerificationRow.created_at) < as_utc(flt.until))
        with self._session() as s:
            total = s.exec(select(func.count()).select_from(VerificationRow).where(*conds)).one()
            rows = s.exec(
                select(VerificationRow)
                .where(*conds)
                .order_by(col(VerificationRow.created_at).desc(), col(VerificationRow.id).desc())
                .offset(offset)
                .limit(limit)
            ).all()
            return list(rows), int(total)

    def finished_ids(self, ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        with self._session() as s:
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                stmt = select(VerificationRow.id).where(
                    col(VerificationRow.id).in_(chunk), col(VerificationRow.state) == "done"
                )
                found.update(s.exec(stmt).all())
        return found

    def active(self) -> list[VerificationRow]:
        with self._session() as s:
            stmt = select(VerificationRow).where(col(VerificationRow.state).in_(ACTIVE_STATES))
            return list(s.exec(stmt).all())

    def repos(self) -> list[str]:
        with self._session() as s:
            stmt = select(VerificationRow.repo).where(col(VerificationRow.repo).is_not(None))
            return sorted({r for r in s.exec(stmt.distinct()).all() if r})

    def counts(self) -> list[tuple[str, str, int]]:
        """(verdict, tier, count) over finished verifications."""
        with self._session() as s:
            stmt = (
                select(VerificationRow.verdict, VerificationRow.tier, func.count())
                .where(col(VerificationRow.verdict).is_not(None))
                .group_by(VerificationRow.verdict, VerificationRow.tier)
            )
            return [(str(v), str(t), int(n)) for v, t, n in s.exec(stmt).all()]

    def dispositions(self, verification_id: str) -> list[DispositionRow]:
        with self._session() as s:
            stmt = (
                select(DispositionRow)
                .where(DispositionRow.verification_id == verification_id)
                .order_by(col(DispositionRow.id))
            )
            return list(s.exec(stmt).all())


def _apply_payload(row: VerificationRow, payload: VerifyResponse, finished: datetime) -> None:
    row.state = "done"
    row.verdict = payload.verdict.value
    row.exit_code = payload.exit_code
    row.confidence = payload.confidence
    row.unclear_reason = payload.unclear_reason.value if payload.unclear_reason else None
    row.error = payload.error
    row.failure = None
    row.runner = payload.runner
    row.timing = dict(payload.timing) if payload.timing else None
    row.payload = json.loads(payload.model_dump_json())
    row.transcript_location = payload.transcript_location or row.transcript_location
    if payload.snapshot is not None:
        row.snapshot_resolved = payload.snapshot.resolved[:256]
    row.updated_at = finished
    row.finished_at = row.finished_at or finished


# Transcript sync ------------------------------------------------------------------------


def verification_id_of(folder: Path) -> str | None:
    """`<UTC time>-<id>` -> id."""
    stamp, sep, vid = folder.name.rpartition("-")
    if not sep or not stamp or not vid or not vid.isalnum():
        return None
    return vid


def _plan_times(folder: Path) -> tuple[float | None, float | None]:
    try:
        data = json.loads((folder / "request.json").read_text())
        plan = data.get("plan") or {}
        return float(plan["created_at"]), float(plan["deadline_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def ingest_transcripts(store: VerificationStore, bases: Iterable[Path]) -> IngestReport:
    """Index every sealed, finished transcript folder under `bases` not indexed yet."""
    report = IngestReport()
    folders: dict[str, Path] = {}
    for base in bases:
        for folder in transcript.list_transcripts(base):
            vid = verification_id_of(folder)
            if vid and (folder / transcript.RESULT_FILE).is_file():
                folders.setdefault(vid, folder)
    if not folders:
        return report
    known = store.finished_ids(sorted(folders))
    for vid, folder in sorted(folders.items()):
        if vid in known:
            continue
        problems = transcript.validate(folder)
        if problems:
            report.skipped.append((str(folder), "; ".join(problems)))
            continue
        try:
            payload = VerifyResponse.model_validate_json(
                (folder / transcript.RESULT_FILE).read_bytes()
            )
        except (OSError, ValueError) as exc:
            report.skipped.append((str(folder), f"result.json unreadable: {type(exc).__name__}"))
            continue
        if payload.verification_id != vid:
            report.skipped.append((str(folder), "result.json names another verification"))
            continue
        created, deadline = _plan_times(folder)
        finished = utc((folder / transcript.RESULT_FILE).stat().st_mtime)
        store.record_payload(
            payload,
            source="transcript",
            created_at=created,
            deadline_at=deadline,
            finished_at=finished,
            transcript_location=str(folder),
        )
        report.added.append(vid)
    for folder_name, why in report.skipped:
        log.warning("transcript %s not indexed: %s", folder_name, why)
    return report
