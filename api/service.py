"""The verification service behind the HTTP API and the MCP server.

One object per process: it turns a request into a `Subject` (from a repository on the
server, or from an inline bundle of files), plans the run, hands it to a runner and records
it in the database.

- Subject from a server-side repository: the path must resolve (symlinks followed) inside
  one of `LLM_COUNCIL_REPO_ROOTS`, and so must the repository's top level. Files are read
  from the commit by `shared.selection.resolve_subject`, never from the work tree. A target
  path that is absolute, holds `..`, or goes through or names a symbolic link in the commit
  that points outside the repository is refused (422).
- Subject from an inline bundle: the client read the files from its own checkout. The
  secret boundary (`shared.selection.secret_rule`) is applied again: a secret path is
  omitted as `denied_secret`, its content dropped before anything is planned, so it reaches
  no prompt, transcript or log. Binary, oversize, noise and ignore-file rules apply as well.
- Runner: the Celery runner when `LLM_COUNCIL_BROKER_URL` is set (`worker.runner`), else the
  embedded runner on a thread pool owned by this service. Either way the run is recorded at
  plan time (state `queued`), on every stage change, and with its payload when done. A
  remote run started with `wait=false` is followed by a tracker thread until its payload
  appears, so it is recorded even if nobody asks for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from api.db.repository import (
    ACTIVE_STATES,
    VerificationFilter,
    VerificationStore,
    as_utc,
    finding_fingerprint,
    ingest_transcripts,
    utc,
    verification_id_of,
)
from api.db.tables import VerificationRow
from api.schemas import (
    CheckOut,
    DispositionIn,
    DispositionOut,
    HealthOut,
    IntegrityOut,
    ProgressOut,
    StageProgressOut,
    TranscriptFileOut,
    TranscriptOut,
    VerificationAccepted,
    VerificationPage,
    VerificationStatus,
    VerificationSummary,
)
from shared import gitsnap, transcript
from shared.models import CoverageReceipt, OmittedPath
from shared.pipeline import RunPlan, plan_run, transcript_base
from shared.request import VerifyRequest
from shared.response import VerifyResponse
from shared.selection import (
    IGNORE_FILE_CHAIN,
    CoveragePolicyError,
    SubjectError,
    allowlisted,
    noise_rule,
    normalize_path,
    resolve_subject,
    secret_rule,
)
from shared.selection.ignorefiles import IgnoreRules
from shared.settings import CouncilSettings
from shared.state import VerificationState
from shared.subject import Subject, SubjectFile
from shared.tiers import Tier
from shared.verdict import unacknowledged

log = logging.getLogger(__name__)

DEFAULT_EMBEDDED_CONCURRENCY = 8
#: A waiting request may wait this long past the verify deadline for the payload.
WAIT_GRACE_S = 10.0
#: A remote run not finished this long after its deadline is no longer tracked here (the
#: worker's watchdog closes it; a later status request records what it wrote).
REMOTE_GIVE_UP_S = 300.0
TRACK_INTERVAL_S = 0.5
SYNC_INTERVAL_S = 2.0
LIVE_KEEP = 2000
REMOTE_WAITERS = 64
MAX_TRANSCRIPT_FILE_BYTES = 2_000_000
API_PREFIX = "/v1/council"


# Errors -------------------------------------------------------------------------------


class ServiceError(Exception):
    status_code = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(ServiceError):
    """The request cannot be verified as asked (HTTP 422)."""

    status_code = 422


class NotFound(ServiceError):
    status_code = 404


class Unavailable(ServiceError):
    """The service cannot run verifications right now (HTTP 503): configuration, broker."""

    status_code = 503


# Requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BundleEntry:
    path: str
    content: str
    executable: bool = False


@dataclass(frozen=True)
class VerifySpec:
    """A verify request as every surface hands it to the service."""

    snapshot_id: str = "HEAD"
    target_paths: tuple[str, ...] | None = None
    tier: Tier | None = None
    rubric_focus: tuple[str, ...] = ()
    confidence_threshold: float | None = None
    repo: str | None = None
    bundle: tuple[BundleEntry, ...] | None = None
    shuffle_seed: int | None = None


def status_url(vid: str) -> str:
    return f"{API_PREFIX}/verifications/{vid}"


def transcript_url(vid: str) -> str:
    return f"{API_PREFIX}/verifications/{vid}/transcript"


def valid_id(vid: str) -> bool:
    return 0 < len(vid) <= 64 and vid.isascii() and vid.isalnum()


# Live state of runs carried out by this process ---------------------------------------


@dataclass
class _Live:
    plan: RunPlan
    source: str
    state: str = "queued"
    progress: dict[str, tuple[int, int]] = field(default_factory=dict)
    payload: VerifyResponse | None = None
    failure: str | None = None
    updated_at: float = field(default_factory=time.time)

    def progress_out(self) -> ProgressOut:
        def one(stage: str) -> StageProgressOut:
            done, total = self.progress.get(stage, (0, 0))
            return StageProgressOut(done=done, total=total)

        return ProgressOut(stage1=one("stage1"), stage2=one("stage2"), chairman=one("chairman"))


def _progress_from_state(st: VerificationState) -> ProgressOut:
    return ProgressOut(
        stage1=StageProgressOut(done=st.stage1.done, total=st.stage1.total),
        stage2=StageProgressOut(done=st.stage2.done, total=st.stage2.total),
        chairman=StageProgressOut(done=st.chairman.done, total=st.chairman.total),
    )


# Metrics ------------------------------------------------------------------------------


class ServiceMetrics:
    """Prometheus metrics of this process, plus counts read from the database on scrape."""

    def __init__(self, store: VerificationStore, settings: CouncilSettings) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.stage_seconds = Histogram(
            "llm_council_stage_duration_seconds",
            "Wall time of each council stage (and the whole run, stage=total).",
            ["stage", "tier", "runner"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200),
            registry=self.registry,
        )
        self.provider_call_seconds = Histogram(
            "llm_council_provider_call_duration_seconds",
            "Latency of one provider call (retries included), by stage and model.",
            ["stage", "provider", "model"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 400),
            registry=self.registry,
        )
        self.provider_errors = Counter(
            "llm_council_provider_errors",
            "Provider calls that failed for good, by error type (billing, auth, rate_limit, "
            "timeout, server, connection, malformed, ...).",
            ["kind", "stage", "provider", "model"],
            registry=self.registry,
        )
        self.registry.register(_DatabaseCollector(store))
        if settings.broker_url:
            self.registry.register(_QueueDepthCollector(settings))

    def observe(self, payload: VerifyResponse) -> None:
        try:
            self._observe(payload)
        except Exception:  # metrics never break a run
            log.debug("metrics: could not observe %s", payload.verification_id, exc_info=True)

    def _observe(self, payload: VerifyResponse) -> None:
        tier = payload.tier.value
        for key, ms in (payload.timing or {}).items():
            stage = key.removesuffix("_ms")
            self.stage_seconds.labels(stage, tier, payload.runner).observe(ms / 1000)
        folder = Path(payload.transcript_location) if payload.transcript_location else None
        calls = list(_calls_in_transcript(folder)) if folder and folder.is_dir() else []
        if calls:
            for stage, model, latency_ms, kind in calls:
                provider, name = _model_labels(model)
                self.provider_call_seconds.labels(stage, provider, name).observe(latency_ms / 1000)
                if kind:
                    self.provider_errors.labels(kind, stage, provider, name).inc()
            return
        diag = payload.diagnostics  # no transcript readable here: errors from the payload
        for model, failure in diag.failed_models.items():
            stage = "stage2" if model.endswith(" (stage2)") else "stage1"
            provider, name = _model_labels(model.removesuffix(" (stage2)"))
            self.provider_errors.labels(failure.kind, stage, provider, name).inc()
        if diag.chairman_error is not None:
            provider, name = _model_labels(diag.chairman_model or payload.chairman or "")
            self.provider_errors.labels(diag.chairman_error.kind, "chairman", provider, name).inc()

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _model_labels(model: str) -> tuple[str, str]:
    from shared.providers.refs import ModelRefError, parse_model_ref

    try:
        ref = parse_model_ref(model)
    except ModelRefError:
        return "unknown", "unknown"
    return ref.provider, ref.model


def _calls_in_transcript(folder: Path) -> Iterator[tuple[str, str, int, str | None]]:
    """(stage, model, latency ms, error kind or None) for every call a transcript records."""

    def load(name: str) -> Any:
        try:
            return json.loads((folder / name).read_text())
        except (OSError, ValueError):
            return None

    stage1 = load("stage1.json")
    if isinstance(stage1, dict):
        for ans in stage1.values():
            if isinstance(ans, dict) and ans.get("model"):
                err = ans.get("error") or {}
                yield "stage1", ans["model"], int(ans.get("latency_ms") or 0), err.get("kind")
    stage2 = load("stage2.json")
    if isinstance(stage2, dict):
        for rev in stage2.get("reviews") or ():
            if isinstance(rev, dict) and rev.get("reviewer"):
                err = rev.get("error") or {}
                yield "stage2", rev["reviewer"], int(rev.get("latency_ms") or 0), err.get("kind")
    chair = load("chairman.json")
    if isinstance(chair, dict) and chair.get("model") and chair.get("findings_source") != "skipped":
        err = chair.get("error") or {}
        yield "chairman", chair["model"], int(chair.get("latency_ms") or 0), err.get("kind")


class _DatabaseCollector:
    def __init__(self, store: VerificationStore) -> None:
        self.store = store

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        fam = CounterMetricFamily(
            "llm_council_verifications",
            "Finished verifications recorded in the database, by verdict and tier.",
            labels=["verdict", "tier"],
        )
        try:
            for verdict, tier, count in self.store.counts():
                fam.add_metric([verdict, tier], count)
        except Exception:
            log.warning("metrics: the database could not be read", exc_info=True)
        yield fam


class _QueueDepthCollector:
    """Queue depth per tier queue (and the worker's own gauges) from `worker.metrics`,
    imported only when a broker is configured. A scrape never fails because of it."""

    def __init__(self, settings: CouncilSettings) -> None:
        self.settings = settings
        self._inner: Any = None

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        try:
            if self._inner is None:
                from worker.metrics import collector

                self._inner = collector(self.settings)
            families = list(self._inner.collect())
        except Exception:
            log.warning("metrics: queue depth unavailable", exc_info=True)
            return
        yield from families


# Audit (shared by the MCP tool, the CLI and the transcript endpoint) -------------------


def read_transcript(folder: Path, vid: str, *, validate: bool) -> TranscriptOut:
    files: list[TranscriptFileOut] = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.is_symlink() or not path.is_file():
            continue
        size = path.stat().st_size
        content: Any
        if size > MAX_TRANSCRIPT_FILE_BYTES:
            content = f"(omitted: {size} bytes)"
        else:
            raw = path.read_bytes()
            content = raw.decode("utf-8", "replace")
            if path.suffix == ".json":
                with contextlib.suppress(ValueError):
                    content = json.loads(content)
        files.append(TranscriptFileOut(name=path.name, size=size, content=content))
    integrity = IntegrityOut(checked=False)
    if validate:
        problems = transcript.validate(folder)
        integrity = IntegrityOut(checked=True, ok=not problems, problems=problems)
    return TranscriptOut(
        verification_id=vid, location=str(folder), files=files, integrity=integrity
    )


def audit_list(
    bases: Iterable[Path], *, validate: bool, limit: int = 50, store: VerificationStore | None
) -> list[dict[str, Any]]:
    """Transcript folders, newest first, with verdicts and (optionally) integrity checks."""
    folders: list[Path] = []
    for base in bases:
        folders.extend(transcript.list_transcripts(base))
    folders.sort(key=lambda p: p.name, reverse=True)
    out: list[dict[str, Any]] = []
    for folder in folders[:limit]:
        vid = verification_id_of(folder) or folder.name
        entry: dict[str, Any] = {"verification_id": vid, "location": str(folder)}
        result = folder / transcript.RESULT_FILE
        verdict = None
        if result.is_file():
            try:
                data = json.loads(result.read_text())
                verdict = data.get("verdict")
                entry["tier"] = data.get("tier")
                entry["exit_code"] = data.get("exit_code")
            except (OSError, ValueError, AttributeError):
                verdict = None
        entry["verdict"] = verdict
        entry["finished"] = result.is_file()
        if store is not None:
            with contextlib.suppress(Exception):
                row = store.get(vid)
                entry["indexed"] = row is not None and row.state == "done"
        if validate:
            problems = transcript.validate(folder) if result.is_file() else ["not finished"]
            entry["integrity_ok"] = not problems
            entry["problems"] = problems
        out.append(entry)
    return out


def find_transcript_folder(
    vid: str, bases: Iterable[Path], store: VerificationStore | None
) -> Path | None:
    if store is not None:
        with contextlib.suppress(Exception):
            row = store.get(vid)
            if row is not None and row.transcript_location:
                folder = Path(row.transcript_location)
                if folder.is_dir():
                    return folder
    for base in bases:
        found = transcript.find_transcript(base, vid)
        if found is not None:
            return found
    return None


# The service --------------------------------------------------------------------------


class VerificationService:
    def __init__(
        self,
        settings: CouncilSettings,
        store: VerificationStore,
        *,
        embedded_concurrency: int = DEFAULT_EMBEDDED_CONCURRENCY,
        default_roots: Sequence[Path] = (),
        client: Any | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        roots = [Path(r) for r in settings.repo_roots] or list(default_roots)
        self.roots: tuple[Path, ...] = tuple(_resolve_root(r) for r in roots)
        self.remote = bool(settings.broker_url)
        self.metrics = ServiceMetrics(store, settings)
        self._client = client
        self._client_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, embedded_concurrency), thread_name_prefix="council-run"
        )
        #: Threads that wait on remote runs for `wait=true` callers (mostly blocked in Redis).
        self._remote_pool = ThreadPoolExecutor(
            max_workers=REMOTE_WAITERS, thread_name_prefix="council-wait"
        )
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}
        self._stop = threading.Event()
        self._tracker: threading.Thread | None = None
        self._last_sync = 0.0
        self._sync_lock = threading.Lock()
        self._recover()

    # Lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=False)
        self._remote_pool.shutdown(wait=False, cancel_futures=False)
        if self._tracker is not None:
            self._tracker.join(timeout=5)

    def _recover(self) -> None:
        """Follow remote runs a previous process left in flight."""
        if not self.remote:
            return
        try:
            for row in self.store.active():
                if row.runner == "celery" and row.deadline_at is not None:
                    self._track(row.id, as_utc(row.deadline_at).timestamp())  # type: ignore[union-attr]
        except Exception:
            log.warning("could not list runs in flight", exc_info=True)

    @property
    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                from shared.providers.client import HttpProviderClient

                self._client = HttpProviderClient.from_settings(self.settings)
            return self._client

    # Subjects -----------------------------------------------------------------------
    def prepare(self, spec: VerifySpec) -> tuple[VerifyRequest, Subject]:
        """Validate a spec and build its subject. Raises InvalidInput."""
        tier = spec.tier or self.settings.default_tier
        _check_unicode(spec)
        if (spec.repo is None) == (spec.bundle is None):
            raise InvalidInput("give exactly one of 'repo' and 'bundle'", field="repo")
        if not spec.snapshot_id or any(c.isspace() or ord(c) < 32 for c in spec.snapshot_id):
            raise InvalidInput(
                f"snapshot_id {spec.snapshot_id!r} is not a revision", field="snapshot_id"
            )
        try:
            if spec.repo is not None:
                top = self.resolve_repo(spec.repo)
                try:
                    subject = self._repo_subject(top, spec)
                except OSError as exc:  # e.g. an argument list too long for git
                    raise InvalidInput(f"git could not be run: {exc.strerror or exc}") from None
                repo_str: str | None = str(top)
            else:
                subject = self._bundle_subject(spec)
                repo_str = None
            request = VerifyRequest(
                snapshot_id=spec.snapshot_id,
                target_paths=spec.target_paths,
                tier=tier,
                rubric_focus=spec.rubric_focus,
                confidence_threshold=spec.confidence_threshold,
                repo=repo_str,
                shuffle_seed=spec.shuffle_seed,
            )
        except CoveragePolicyError as exc:
            raise InvalidInput(str(exc), field="target_paths") from None
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"]) or "body"
            raise InvalidInput(f"{name}: {err['msg']}", field=name) from None
        return request, subject

    def resolve_repo(self, raw: str) -> Path:
        """The repository's top level, which must lie inside an allowed root."""
        if not self.roots:
            raise InvalidInput(
                "this server verifies no server-side repository (LLM_COUNCIL_REPO_ROOTS is "
                "not set): send the files as an inline 'bundle' instead",
                field="repo",
            )
        if not raw.strip() or any(ord(c) < 32 for c in raw):
            raise InvalidInput("repo is empty or holds a control character", field="repo")
        path = Path(raw)
        if not path.is_absolute():
            path = self.roots[0] / path
        try:
            resolved = path.resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            raise InvalidInput(f"repo {raw!r} does not exist on the server", field="repo") from None
        if not self._inside_roots(resolved):
            raise InvalidInput(
                f"repo {raw!r} resolves outside the allowed roots (LLM_COUNCIL_REPO_ROOTS)",
                field="repo",
            )
        if not resolved.is_dir():
            raise InvalidInput(f"repo {raw!r} is not a directory", field="repo")
        try:
            top = gitsnap.toplevel(resolved).resolve()
        except (gitsnap.GitError, OSError):
            raise InvalidInput(f"repo {raw!r} is not a git repository", field="repo") from None
        if not self._inside_roots(top):
            raise InvalidInput(
                f"repo {raw!r} belongs to a repository outside the allowed roots", field="repo"
            )
        return top

    def _inside_roots(self, path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def _repo_subject(self, top: Path, spec: VerifySpec) -> Subject:
        try:
            sha = gitsnap.resolve_commit(top, spec.snapshot_id)
        except gitsnap.GitError:
            raise InvalidInput(
                f"snapshot_id {spec.snapshot_id!r} names no commit in the repository",
                field="snapshot_id",
            ) from None
        paths = None
        if spec.target_paths is not None:
            paths = _normalise_targets(spec.target_paths, "target_paths")
            self._check_links(top, sha, paths)
        try:
            return resolve_subject(top, sha, spec.target_paths, settings=self.settings)
        except CoveragePolicyError:
            raise
        except SubjectError as exc:
            raise InvalidInput(str(exc), field="target_paths") from None
        except gitsnap.GitError as exc:
            raise InvalidInput(f"git could not read the snapshot: {exc}") from None

    def _check_links(self, top: Path, sha: str, paths: Sequence[str]) -> None:
        """Refuse a target path that is, or goes through, a link leaving the repository."""
        prefixes: set[str] = set()
        for p in paths:
            parts = p.split("/") if p else []
            prefixes.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        if not prefixes:
            return
        try:
            entries = gitsnap.ls_root(top, sha, sorted(prefixes))
        except gitsnap.GitError as exc:
            raise InvalidInput(f"git could not list the snapshot: {exc}") from None
        links = {p: e for p, e in entries.items() if e.mode == gitsnap.MODE_SYMLINK}
        if not links:
            return
        targets: dict[str, str] = {}
        by_sha = {e.sha: p for p, e in links.items()}
        try:
            for blob in gitsnap.read_blobs(top, list(by_sha), max_bytes=4096):
                data = blob.data if blob.data is not None else blob.head
                targets[by_sha.get(blob.sha, "")] = data.decode("utf-8", "replace")
        except gitsnap.GitError as exc:
            raise InvalidInput(f"git could not read the snapshot: {exc}") from None
        for i, p in enumerate(paths):
            parts = p.split("/")
            for depth in range(1, len(parts) + 1):
                prefix = "/".join(parts[:depth])
                if prefix not in links:
                    continue
                target = targets.get(prefix, "")
                where = f"target_paths[{i}]"
                if depth < len(parts):
                    raise InvalidInput(
                        f"{where} {p!r} goes through the symbolic link {prefix!r} "
                        f"(-> {target!r}); name a path inside the repository",
                        field=where,
                    )
                joined = posixpath.normpath(posixpath.join(posixpath.dirname(prefix), target))
                if target.startswith("/") or joined == ".." or joined.startswith("../"):
                    raise InvalidInput(
                        f"{where} {p!r} is a symbolic link pointing outside the repository "
                        f"(-> {target!r})",
                        field=where,
                    )

    def _bundle_subject(self, spec: VerifySpec) -> Subject:
        assert spec.bundle is not None
        settings = self.settings
        files: dict[str, BundleEntry] = {}
        for i, entry in enumerate(spec.bundle):
            where = f"bundle.files[{i}].path"
            norm = _normalise_one(entry.path, where)
            if not norm:
                raise InvalidInput(f"{where} names the repository root, not a file", field=where)
            if norm in files:
                raise InvalidInput(f"{where} {entry.path!r} appears twice", field=where)
            files[norm] = entry
        for norm in files:
            parent = norm.rsplit("/", 1)[0] if "/" in norm else ""
            while parent:
                if parent in files:
                    raise InvalidInput(
                        f"bundle names {parent!r} as a file and also files below it",
                        field="bundle.files",
                    )
                parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
        targets = (
            _normalise_targets(spec.target_paths, "target_paths")
            if spec.target_paths is not None
            else None
        )
        ignore = IgnoreRules()
        for name in IGNORE_FILE_CHAIN:
            if name in files:
                try:
                    ignore = IgnoreRules.parse(name, files[name].content)
                except ValueError as exc:
                    raise InvalidInput(
                        f"the bundle's {name} holds an invalid pattern: {exc}",
                        field="bundle.files",
                    ) from None
                break

        chosen: list[tuple[str, Literal["explicit", "discovered"]]] = []  # (path, origin)
        omitted: list[OmittedPath] = []
        if targets is None:
            chosen = [(p, "discovered") for p in files]
        else:
            seen: set[str] = set()
            for t in targets:
                hits = [p for p in files if p == t or not t or p.startswith(t + "/")]
                if not hits and t not in seen:
                    missing = "denied_secret" if secret_rule(t) else "not_found"
                    omitted.append(OmittedPath(path=t, reason=missing, origin="explicit"))
                    seen.add(t)
                for p in hits:
                    if p not in seen:
                        chosen.append((p, "explicit" if p == t else "discovered"))
                        seen.add(p)

        reviewed: list[SubjectFile] = []
        for path, origin in chosen:
            entry = files[path]
            reason = _bundle_reason(path, entry.content, origin, ignore, settings)
            if reason is None:
                content = entry.content.removeprefix("\ufeff")
                reviewed.append(
                    SubjectFile(path=path, content=content, executable=entry.executable)
                )
            else:
                omitted.append(OmittedPath(path=path, reason=reason, origin=origin))
        coverage = CoverageReceipt(
            requested=tuple(spec.target_paths) if spec.target_paths is not None else None,
            reviewed=tuple(f.path for f in reviewed),
            omitted=tuple(omitted),
            explicit_omitted=any(o.origin == "explicit" for o in omitted),
            truncated=False,
            conservation_ok=True,
            policy=settings.coverage_policy,
        )
        if settings.coverage_policy == "fail":
            blocking = unacknowledged(omitted, settings.coverage_ack_reasons)
            if blocking:
                raise CoveragePolicyError(blocking, settings.coverage_ack_reasons)
        return Subject(
            repo=None,
            snapshot_requested=spec.snapshot_id,
            snapshot_resolved=spec.snapshot_id,
            files=tuple(reviewed),
            coverage=coverage,
            expanded_paths=None,
            paths_truncated=False,
            expansion_warnings=(),
        )

    # Running ------------------------------------------------------------------------
    def check_council(self, tier: Tier) -> None:
        """Refuse (503) to start a run the configured council cannot carry out here."""
        if self.remote:
            return  # the workers hold the provider keys
        from shared.providers.client import ProviderKeys, missing_credentials
        from shared.providers.refs import parse_model_ref

        refs = [
            parse_model_ref(m)
            for m in (*self.settings.council_for(tier), self.settings.chairman_for(tier))
        ]
        missing = missing_credentials(refs, ProviderKeys.from_settings(self.settings))
        if missing:
            raise Unavailable(
                f"no council configured on this server: set {' and '.join(missing)}, or "
                "choose models with LLM_COUNCIL_MODELS and LLM_COUNCIL_CHAIRMAN"
            )

    def start(self, spec: VerifySpec, *, source: str) -> RunPlan:
        """Plan a run and record it; it is not running yet (see `verify`)."""
        request, subject = self.prepare(spec)
        self.check_council(request.tier)
        try:
            plan = plan_run(request, self.settings, subject)
        except OSError as exc:
            raise Unavailable(f"cannot write the transcript: {exc.strerror or exc}") from None
        with self._lock:
            self._live[plan.verification_id] = _Live(plan=plan, source=source)
            while len(self._live) > LIVE_KEEP:
                self._live.popitem(last=False)
        self._safe(
            self.store.record_planned,
            plan,
            source=source,
            runner="celery" if self.remote else "embedded",
        )
        return plan

    def submit(
        self, spec: VerifySpec, *, source: str, wait: bool
    ) -> tuple[RunPlan, Future[VerifyResponse] | None]:
        """Plan, record and start a run. Returns the plan and, when the caller will wait,
        a future of its payload (a remote run started without waiting returns None: the
        tracker follows it). Holds the calling thread only for planning."""
        plan = self.start(spec, source=source)
        if self.remote:
            if wait:
                return plan, self._remote_pool.submit(self._run_remote_blocking, plan)
            self._submit_remote(plan)
            return plan, None
        return plan, self._pool.submit(self._run_embedded_job, plan)

    def wait_timeout(self, plan: RunPlan) -> float:
        return max(0.0, plan.deadline_at - time.time()) + WAIT_GRACE_S

    def outcome(
        self, plan: RunPlan, fut: Future[VerifyResponse]
    ) -> VerifyResponse | VerificationAccepted:
        """The payload of a finished future, or the handle when it is still running."""
        if not fut.done():
            log.warning("verification %s still running past its deadline", plan.verification_id)
            return self.accepted(plan)
        exc = fut.exception()
        if isinstance(exc, ServiceError):
            raise exc
        if exc is not None:
            raise Unavailable(f"the verification {plan.verification_id} failed: {exc}")
        return fut.result()

    def verify(
        self, spec: VerifySpec, *, source: str, wait: bool
    ) -> VerifyResponse | VerificationAccepted:
        """Run a verification, blocking this thread: its payload when `wait` (at most until
        the verify deadline plus a grace), else at once a handle to poll."""
        plan, fut = self.submit(spec, source=source, wait=wait)
        if fut is None or not wait:
            return self.accepted(plan)
        with contextlib.suppress(FutureTimeout):
            fut.result(timeout=self.wait_timeout(plan))
        return self.outcome(plan, fut)

    def accepted(self, plan: RunPlan) -> VerificationAccepted:
        vid = plan.verification_id
        live = self._live.get(vid)
        return VerificationAccepted(
            verification_id=vid,
            state=(live.state if live else "queued"),
            tier=plan.tier.value,
            created_at=utc(plan.created_at),
            deadline_at=utc(plan.deadline_at),
            verify_deadline_s=round(plan.deadline_at - plan.created_at, 3),
            status_url=status_url(vid),
            transcript_url=transcript_url(vid),
        )

    def _progress(self, vid: str, stage: str, done: int, total: int) -> None:
        with self._lock:
            live = self._live.get(vid)
            if live is None:
                return
            changed = live.state != stage
            live.state = stage
            live.progress[stage] = (done, total)
            live.updated_at = time.time()
        if changed:
            self._safe(self.store.record_progress, vid, stage)

    def _finish(self, plan_or_vid: RunPlan | str, payload: VerifyResponse, source: str) -> None:
        vid = payload.verification_id
        with self._lock:
            live = self._live.get(vid)
            if live is not None:
                live.payload = payload
                live.state = "done"
                live.updated_at = time.time()
        plan = plan_or_vid if isinstance(plan_or_vid, RunPlan) else None
        self._safe(
            self.store.record_payload,
            payload,
            source=source,
            created_at=plan.created_at if plan else None,
            deadline_at=plan.deadline_at if plan else None,
        )
        self.metrics.observe(payload)

    def _fail(self, vid: str, message: str) -> None:
        with self._lock:
            live = self._live.get(vid)
            if live is not None:
                live.failure = message
                live.state = "error"
        self._safe(self.store.record_failure, vid, message)

    def _run_embedded_job(self, plan: RunPlan) -> VerifyResponse:
        from shared.embedded import run_embedded

        vid = plan.verification_id
        source = self._live[vid].source if vid in self._live else "api"
        try:
            payload = run_embedded(
                plan,
                self.client,
                on_progress=lambda st, d, n: self._progress(vid, st, d, n),
            )
        except Exception as exc:
            log.exception("embedded run %s failed", vid)
            self._fail(vid, f"the embedded runner failed: {type(exc).__name__}: {exc}")
            raise
        self._finish(plan, payload, source)
        return payload

    def _run_remote_blocking(self, plan: RunPlan) -> VerifyResponse:
        run_remote = _worker_runner().run_remote
        vid = plan.verification_id
        source = self._live[vid].source if vid in self._live else "api"
        try:
            payload = run_remote(
                plan, self.settings, on_progress=lambda st, d, n: self._progress(vid, st, d, n)
            )
        except ConnectionError as exc:
            self._fail(vid, f"the broker is unreachable: {exc}")
            raise Unavailable(f"the broker is unreachable: {exc}") from None
        self._finish(plan, payload, source)
        return payload

    def _submit_remote(self, plan: RunPlan) -> None:
        submit_remote = _worker_runner().submit_remote
        vid = plan.verification_id
        try:
            submit_remote(plan, self.settings)
        except ConnectionError as exc:
            self._fail(vid, f"the broker is unreachable: {exc}")
            raise Unavailable(f"the broker is unreachable: {exc}") from None
        self._track(vid, plan.deadline_at)

    def _track(self, vid: str, deadline_at: float) -> None:
        with self._lock:
            self._pending[vid] = deadline_at
            if self._tracker is None or not self._tracker.is_alive():
                self._tracker = threading.Thread(
                    target=self._tracker_loop, name="council-remote-tracker", daemon=True
                )
                self._tracker.start()

    def _tracker_loop(self) -> None:
        while not self._stop.wait(TRACK_INTERVAL_S):
            with self._lock:
                pending = list(self._pending.items())
            if not pending:
                continue
            for vid, deadline in pending:
                st = self._remote_state(vid)
                if st is not None and st.payload is not None:
                    self._mirror(vid, st.payload)
                    self._finish(vid, st.payload, self._source_of(vid))
                elif st is not None:
                    self._remote_progress(vid, st)
                if (st is not None and st.payload is not None) or (
                    time.time() > deadline + REMOTE_GIVE_UP_S
                ):
                    with self._lock:
                        self._pending.pop(vid, None)

    def _remote_progress(self, vid: str, st: VerificationState) -> None:
        with self._lock:
            live = self._live.get(vid)
            changed = live is None or live.state != st.state
            if live is not None:
                live.state = st.state
        if changed:
            self._safe(self.store.record_progress, vid, st.state)

    def _mirror(self, vid: str, payload: VerifyResponse) -> None:
        """A worker on another machine wrote the transcript there: write it here too."""
        live = self._live.get(vid)
        if live is None or (live.plan.folder / transcript.RESULT_FILE).exists():
            return
        try:
            from worker.config import WorkerSettings
            from worker.runner import mirror_transcript, runner_context

            mirror_transcript(runner_context(self.settings, WorkerSettings()), live.plan, payload)
        except Exception:
            log.warning("could not mirror the transcript of %s", vid, exc_info=True)

    def _source_of(self, vid: str) -> str:
        live = self._live.get(vid)
        return live.source if live else "api"

    def _remote_state(self, vid: str) -> VerificationState | None:
        try:
            state: VerificationState | None = _worker_runner().get_state(vid, self.settings)
            return state
        except Exception:
            log.debug("remote state of %s unavailable", vid, exc_info=True)
            return None

    # Reading ------------------------------------------------------------------------
    def transcript_bases(self) -> list[Path]:
        """Where transcripts of this server's runs and of `gate` runs may lie: the working
        directory's, every repository the database knows, and each allowed root and its
        direct children (a root of checkouts)."""
        bases = {transcript_base(self.settings, None)}
        repos: set[Path] = set()
        with contextlib.suppress(Exception):
            repos.update(Path(r) for r in self.store.repos())
        for root in self.roots:
            repos.add(root)
            with contextlib.suppress(OSError):
                repos.update(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
        for repo in repos:
            bases.add(transcript_base(self.settings, repo))
        out = []
        for base in bases:
            with contextlib.suppress(OSError):
                if base.is_dir():
                    out.append(base)
        return sorted(out)

    def sync(self, *, force: bool = False) -> None:
        """Index transcript folders not recorded yet (e.g. runs of `llm-council gate`)."""
        now = time.time()
        if not force and now - self._last_sync < SYNC_INTERVAL_S:
            return
        if not self._sync_lock.acquire(blocking=False):
            return
        try:
            self._last_sync = now
            ingest_transcripts(self.store, self.transcript_bases())
        except Exception:
            log.warning("could not sync transcripts into the database", exc_info=True)
        finally:
            self._sync_lock.release()

    def status(self, vid: str) -> VerificationStatus:
        if not valid_id(vid):
            raise NotFound(f"no verification {vid!r}")
        with self._lock:
            live = self._live.get(vid)
        if live is not None and live.payload is None and live.failure is None:
            return self._live_status(live)
        row = self._get_row(vid)
        if live is not None and (row is None or row.state in ACTIVE_STATES):
            # Ours, and finished a moment ago (or its database write failed).
            return self._live_status(live)
        if row is None:
            self.sync(force=True)
            row = self._get_row(vid)
        if row is None:
            raise NotFound(f"no verification {vid!r}")
        progress = None
        if row.state in ACTIVE_STATES:
            row, progress = self._refresh_active(row)
        return _status_from_row(row, progress)

    def _get_row(self, vid: str) -> VerificationRow | None:
        try:
            return self.store.get(vid)
        except Exception as exc:
            raise Unavailable(f"the database cannot be read: {type(exc).__name__}") from None

    def _refresh_active(self, row: VerificationRow) -> tuple[VerificationRow, ProgressOut | None]:
        if row.runner == "celery" and self.remote:
            st = self._remote_state(row.id)
            if st is not None and st.payload is not None:
                self._mirror(row.id, st.payload)
                self._finish(row.id, st.payload, row.source)
                return self._get_row(row.id) or row, None
            if st is not None:
                self._remote_progress(row.id, st)
                row.state = st.state
                return row, _progress_from_state(st)
            return row, None
        deadline = as_utc(row.deadline_at)
        if deadline is not None and time.time() > deadline.timestamp() + WAIT_GRACE_S * 3:
            # Not running here, past its deadline: either another process finished it (its
            # transcript says so) or the process carrying it stopped.
            self.sync(force=True)
            fresh = self._get_row(row.id) or row
            if fresh.state in ACTIVE_STATES:
                self._safe(
                    self.store.record_failure,
                    row.id,
                    "the process carrying this run stopped before it finished; no verdict "
                    "was formed (start the verification again)",
                )
                fresh = self._get_row(row.id) or fresh
            return fresh, None
        return row, None

    def _live_status(self, live: _Live) -> VerificationStatus:
        plan = live.plan
        vid = plan.verification_id
        return VerificationStatus(
            verification_id=vid,
            state=live.state,
            tier=plan.tier.value,
            snapshot_requested=plan.snapshot.requested,
            snapshot_resolved=plan.snapshot.resolved,
            repo=plan.snapshot.repo,
            runner="celery" if self.remote else "embedded",
            source=live.source,
            created_at=utc(plan.created_at),
            deadline_at=utc(plan.deadline_at),
            updated_at=utc(live.updated_at),
            transcript_location=plan.transcript_path,
            status_url=status_url(vid),
            transcript_url=transcript_url(vid),
            progress=live.progress_out(),
            failure=live.failure,
            payload=live.payload,
            verdict=live.payload.verdict.value if live.payload else None,
            exit_code=live.payload.exit_code if live.payload else None,
        )

    def list_verifications(
        self, flt: VerificationFilter, *, limit: int, offset: int
    ) -> VerificationPage:
        self.sync()
        try:
            rows, total = self.store.search(flt, limit=limit, offset=offset)
        except Exception as exc:
            raise Unavailable(f"the database cannot be read: {type(exc).__name__}") from None
        nxt = offset + len(rows)
        return VerificationPage(
            items=[_summary_from_row(r) for r in rows],
            total=total,
            limit=limit,
            offset=offset,
            next_offset=nxt if nxt < total else None,
        )

    def transcript(self, vid: str, *, validate: bool) -> TranscriptOut:
        if not valid_id(vid):
            raise NotFound(f"no verification {vid!r}")
        folder = find_transcript_folder(vid, self.transcript_bases(), self.store)
        if folder is None:
            self.status(vid)  # 404 for an unknown id
            raise NotFound(f"the transcript of {vid} is not on this server")
        return read_transcript(folder, vid, validate=validate)

    def audit(self, vid: str | None, *, validate: bool, limit: int = 50) -> dict[str, Any]:
        self.sync(force=True)
        bases = self.transcript_bases()
        if vid is None:
            items = audit_list(bases, validate=validate, limit=limit, store=self.store)
            return {"transcripts": items, "count": len(items)}
        if not valid_id(vid):
            raise NotFound(f"no verification {vid!r}")
        folder = find_transcript_folder(vid, bases, self.store)
        if folder is None:
            raise NotFound(f"no transcript for verification {vid!r}")
        return audit_one(folder, vid, validate=validate)

    def add_disposition(self, vid: str, body: DispositionIn) -> DispositionOut:
        st = self.status(vid)
        fingerprint = None
        if body.finding_index is not None:
            if st.payload is None:
                raise InvalidInput(
                    f"verification {vid} has no findings yet (state {st.state})",
                    field="finding_index",
                )
            findings = st.payload.findings
            if body.finding_index >= len(findings):
                raise InvalidInput(
                    f"finding_index {body.finding_index} is out of range: the verification "
                    f"has {len(findings)} finding(s)",
                    field="finding_index",
                )
            fingerprint = finding_fingerprint(findings[body.finding_index].model_dump())
        row = self.store.add_disposition(
            vid,
            decision=body.decision,
            finding_index=body.finding_index,
            finding_fingerprint=fingerprint,
            author=body.author,
            note=body.note,
        )
        return _disposition_out(row)

    def dispositions(self, vid: str) -> list[DispositionOut]:
        self.status(vid)
        return [_disposition_out(r) for r in self.store.dispositions(vid)]

    def health(self) -> HealthOut:
        checks: dict[str, CheckOut] = {}
        try:
            self.store.ping()
            checks["database"] = CheckOut(ok=True)
        except Exception as exc:
            checks["database"] = CheckOut(ok=False, detail=type(exc).__name__)
        if self.remote:
            urls = {"redis": self.settings.redis_url}
            broker = self.settings.broker_url or ""
            if broker.startswith(("redis://", "rediss://")) and broker != self.settings.redis_url:
                urls["broker"] = broker
            for name, url in urls.items():
                checks[name] = _ping_redis(url)
        ok = all(c.ok for c in checks.values())
        return HealthOut(status="ok" if ok else "unavailable", checks=checks)

    # Helpers ------------------------------------------------------------------------
    def _safe(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Database writes never fail a run: the transcript stays the record, and the next
        sync indexes it."""
        try:
            fn(*args, **kwargs)
        except Exception:
            log.warning("database write %s failed", getattr(fn, "__name__", fn), exc_info=True)


def audit_one(folder: Path, vid: str, *, validate: bool) -> dict[str, Any]:
    result: Any = None
    with contextlib.suppress(OSError, ValueError):
        result = json.loads((folder / transcript.RESULT_FILE).read_text())
    out: dict[str, Any] = {
        "verification_id": vid,
        "location": str(folder),
        "files": sorted(
            p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
        ),
        "result": result,
    }
    if validate:
        problems = transcript.validate(folder)
        out["integrity"] = {"checked": True, "ok": not problems, "problems": problems}
    else:
        out["integrity"] = {"checked": False}
    return out


def _ping_redis(url: str) -> CheckOut:
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
        return CheckOut(ok=True)
    except Exception as exc:
        return CheckOut(ok=False, detail=type(exc).__name__)


def _worker_runner() -> Any:
    try:
        from worker import runner
    except ImportError as exc:
        raise Unavailable(
            f"LLM_COUNCIL_BROKER_URL is set but the Celery runner cannot be loaded: {exc}"
        ) from None
    return runner


def _check_unicode(spec: VerifySpec) -> None:
    texts: list[tuple[str, str]] = [("snapshot_id", spec.snapshot_id)]
    texts += [(f"target_paths[{i}]", p) for i, p in enumerate(spec.target_paths or ())]
    texts += [(f"rubric_focus[{i}]", p) for i, p in enumerate(spec.rubric_focus)]
    if spec.repo is not None:
        texts.append(("repo", spec.repo))
    for i, f in enumerate(spec.bundle or ()):
        texts += [(f"bundle.files[{i}].path", f.path), (f"bundle.files[{i}].content", f.content)]
    for name, value in texts:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(
                f"{name} is not valid Unicode (it holds a lone surrogate)", field=name
            ) from None


def _resolve_root(root: Path) -> Path:
    try:
        return root.expanduser().resolve()
    except (OSError, RuntimeError):
        return root


def _normalise_one(raw: str, where: str) -> str:
    try:
        return normalize_path(raw)
    except SubjectError as exc:
        msg = str(exc).replace("--file-paths entry", where)
        raise InvalidInput(msg, field=where) from None


def _normalise_targets(paths: Sequence[str], name: str) -> list[str]:
    return [_normalise_one(p, f"{name}[{i}]") for i, p in enumerate(paths)]


def _bundle_reason(
    path: str, content: str, origin: str, ignore: IgnoreRules, settings: CouncilSettings
) -> str | None:
    """Why a bundle file is not reviewed (the same rule order as `shared.selection`)."""
    if secret_rule(path) is not None:
        return "denied_secret"
    if ignore.match(path) is not None:
        return "ignored"
    if origin == "discovered" and noise_rule(path) is not None:
        return "noise"
    if origin == "discovered" and path.lower().endswith(".svg") and not settings.review_svg:
        return "binary"
    if settings.file_selection in ("allowlist", "shadow") and not allowlisted(path):
        return "non-text"
    if "\x00" in content[:8000]:
        return "binary"
    if len(content) > settings.max_file_chars:
        return "too_large"
    return None


def _summary_fields(row: VerificationRow) -> dict[str, Any]:
    return {
        "verification_id": row.id,
        "state": row.state,
        "tier": row.tier,
        "snapshot_requested": row.snapshot_requested,
        "snapshot_resolved": row.snapshot_resolved,
        "repo": row.repo,
        "verdict": row.verdict,
        "exit_code": row.exit_code,
        "confidence": row.confidence,
        "unclear_reason": row.unclear_reason,
        "error": row.error,
        "failure": row.failure,
        "runner": row.runner,
        "source": row.source,
        "created_at": as_utc(row.created_at),
        "deadline_at": as_utc(row.deadline_at),
        "updated_at": as_utc(row.updated_at),
        "finished_at": as_utc(row.finished_at),
        "transcript_location": row.transcript_location,
        "status_url": status_url(row.id),
        "transcript_url": transcript_url(row.id),
    }


def _summary_from_row(row: VerificationRow) -> VerificationSummary:
    return VerificationSummary(**_summary_fields(row))


def _status_from_row(row: VerificationRow, progress: ProgressOut | None) -> VerificationStatus:
    payload = None
    if row.payload is not None:
        try:
            payload = VerifyResponse.model_validate(row.payload)
        except ValueError:
            log.warning("stored payload of %s does not re-derive its verdict", row.id)
    return VerificationStatus(**_summary_fields(row), progress=progress, payload=payload)


def _disposition_out(row: Any) -> DispositionOut:
    return DispositionOut(
        id=row.id,
        verification_id=row.verification_id,
        decision=row.decision,
        finding_index=row.finding_index,
        finding_fingerprint=row.finding_fingerprint,
        author=row.author,
        note=row.note,
        created_at=as_utc(row.created_at),
    )
