"""Open the database and check its schema version at start-up.

Location: `LLM_COUNCIL_DATABASE_URL` when set (PostgreSQL: `postgresql://user@host/db`; the
psycopg 3 driver is chosen for you), else SQLite at `<state_dir>/council.db` (default
`.council/council.db`) relative to the directory the command works in.

Migrations: create-all plus a schema-version table. `init_db` creates any missing table
(never alters an existing one), then reads `llm_council_schema_version`:

- no row: a fresh database; the current `SCHEMA_VERSION` is written.
- the same version: nothing to do.
- older: each step in `MIGRATIONS` from that version up runs in one transaction, then the
  row is updated; a missing step stops start-up with `SchemaVersionError`.
- newer: written by a newer llm-council; start-up stops rather than guess.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event, select, text
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.pool import StaticPool
from sqlmodel import SQLModel, create_engine

from api.db.tables import SCHEMA_VERSION, SchemaVersionRow
from shared.settings import CouncilSettings

log = logging.getLogger(__name__)

DB_FILE_NAME = "council.db"

#: from_version -> a step that migrates the schema to from_version + 1 (none yet).
MIGRATIONS: dict[int, Callable[[Connection], None]] = {}


class DatabaseError(RuntimeError):
    """The database cannot be used; the message says why and what to do."""


class SchemaVersionError(DatabaseError):
    """The database's schema version is not one this code can use."""


def default_database_url(settings: CouncilSettings, base: Path | None = None) -> str:
    state = settings.state_dir
    if not state.is_absolute():
        state = (base or Path.cwd()) / state
    return f"sqlite:///{state / DB_FILE_NAME}"


def database_url_for(settings: CouncilSettings, base: Path | None = None) -> str:
    return normalise_url(settings.database_url or default_database_url(settings, base))


def normalise_url(url: str) -> str:
    """Pick the installed psycopg 3 driver for plain PostgreSQL URLs."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://{user}@{host}"


def make_engine(url: str) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        memory = url in ("sqlite://", "sqlite:///:memory:")
        if not memory:
            path = Path(url.split(":///", 1)[1])
            path.parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}}
        if memory:
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            if not memory:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    connect_args: dict[str, Any] = {}
    if url.startswith("postgresql"):
        connect_args["connect_timeout"] = 5
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def _read_version(conn: Connection) -> int | None:
    table = SchemaVersionRow.__table__  # type: ignore[attr-defined]
    row = conn.execute(select(table.c.version).where(table.c.id == 1)).first()
    return None if row is None else int(row[0])


def _create_all(engine: Engine) -> None:
    for attempt in range(3):
        try:
            SQLModel.metadata.create_all(engine)
            return
        except (IntegrityError, ProgrammingError):
            # Another process created the same table at the same moment; look again.
            if attempt == 2:
                raise
            time.sleep(0.2)


def init_db(engine: Engine) -> int:
    """Create missing tables and check (or migrate) the schema version. Returns it."""
    try:
        _create_all(engine)
        with engine.begin() as conn:
            found = _read_version(conn)
            if found is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            SchemaVersionRow.__table__.insert().values(  # type: ignore[attr-defined]
                                id=1, version=SCHEMA_VERSION, applied_at=datetime.now(UTC)
                            )
                        )
                except IntegrityError:
                    found = _read_version(conn)
            if found is None or found == SCHEMA_VERSION:
                return SCHEMA_VERSION
            if found > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"the database has schema version {found}, newer than this llm-council's "
                    f"{SCHEMA_VERSION}: upgrade llm-council or point LLM_COUNCIL_DATABASE_URL "
                    "at another database"
                )
            for version in range(found, SCHEMA_VERSION):
                step = MIGRATIONS.get(version)
                if step is None:
                    raise SchemaVersionError(
                        f"the database has schema version {found} and no migration from "
                        f"version {version} to {version + 1} exists"
                    )
                log.info("migrating database schema %d -> %d", version, version + 1)
                step(conn)
            conn.execute(
                SchemaVersionRow.__table__.update()  # type: ignore[attr-defined]
                .where(SchemaVersionRow.id == 1)
                .values(version=SCHEMA_VERSION, applied_at=datetime.now(UTC))
            )
            return SCHEMA_VERSION
    except SchemaVersionError:
        raise
    except (OperationalError, ProgrammingError) as exc:
        raise DatabaseError(
            f"cannot open the database {redact(str(engine.url))}: {str(exc.orig).strip()}"
        ) from None


def open_database(settings: CouncilSettings, base: Path | None = None) -> Engine:
    """The engine for the configured database, schema checked. Raises DatabaseError."""
    url = database_url_for(settings, base)
    try:
        engine = make_engine(url)
    except Exception as exc:  # bad URL, missing driver
        raise DatabaseError(f"cannot use LLM_COUNCIL_DATABASE_URL {redact(url)}: {exc}") from None
    init_db(engine)
    return engine


def ping(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
