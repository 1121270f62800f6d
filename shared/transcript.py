"""Transcripts: one folder per verification under `.council/logs/<UTC time>-<id>/`.

Each file is written atomically (temp file, fsync, rename). `integrity.json` holds the
SHA-256 of every other file so `audit --validate` can tell an altered transcript.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic_core import to_json

INTEGRITY_FILE = "integrity.json"
RESULT_FILE = "result.json"


def transcript_dir_name(verification_id: str, created_at: float) -> str:
    stamp = datetime.fromtimestamp(created_at, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{verification_id}"


def atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write via a temp file and rename, so a reader never sees half a file.

    `durable` also fsyncs the data before the rename (and the folder after it); stage files
    skip that, because the sealed result is what must survive a crash.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if durable:
            _fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


DURABLE_FILES = frozenset({"request.json", RESULT_FILE, INTEGRITY_FILE})


def write_json(folder: Path, name: str, obj: Any) -> Path:
    """Write `obj` (models, or dicts and lists of them) as indented JSON."""
    path = folder / name
    atomic_write(path, to_json(obj, indent=2), durable=name in DURABLE_FILES)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def seal(folder: Path) -> dict[str, str]:
    """Write integrity.json over every other file in the folder."""
    files = {
        p.name: _digest(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != INTEGRITY_FILE and not p.name.startswith(".")
    }
    manifest = json.dumps(files, sort_keys=True).encode()
    write_json(
        folder,
        INTEGRITY_FILE,
        {"algorithm": "sha256", "files": files, "manifest": hashlib.sha256(manifest).hexdigest()},
    )
    return files


def validate(folder: Path) -> list[str]:
    """Problems found with a sealed transcript; an empty list means intact."""
    index = folder / INTEGRITY_FILE
    if not index.is_file():
        return [f"{INTEGRITY_FILE} is missing"]
    try:
        data = json.loads(index.read_text())
        recorded: dict[str, str] = data["files"]
        manifest = json.dumps(recorded, sort_keys=True).encode()
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{INTEGRITY_FILE} is unreadable: {type(exc).__name__}"]
    problems = []
    if hashlib.sha256(manifest).hexdigest() != data.get("manifest"):
        problems.append("the file list in integrity.json was altered")
    present = {
        p.name
        for p in folder.iterdir()
        if p.is_file() and p.name != INTEGRITY_FILE and not p.name.startswith(".")
    }
    for name in sorted(present - recorded.keys()):
        problems.append(f"{name} was added after sealing")
    for name, digest in sorted(recorded.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif _digest(path) != digest:
            problems.append(f"{name} was altered")
    return problems


def find_transcript(base: Path, verification_id: str) -> Path | None:
    if not base.is_dir():
        return None
    for child in base.iterdir():
        if child.is_dir() and child.name.endswith(f"-{verification_id}"):
            return child
    return None


def list_transcripts(base: Path) -> list[Path]:
    if not base.is_dir():
        return []
    return sorted((p for p in base.iterdir() if p.is_dir()), reverse=True)
