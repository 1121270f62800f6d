"""The HTTP API: `create_app(settings)` builds the FastAPI app around one VerificationService.

Settings are read once by the caller (`llm-council serve` reads them at start-up) and handed
in; endpoints receive them, and the service, through `Annotated` dependencies. See
docs/api.md for the endpoints, auth, limits and error statuses.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.db.engine import open_database
from api.db.repository import VerificationFilter, VerificationStore
from api.schemas import (
    DispositionIn,
    DispositionOut,
    ErrorOut,
    HealthOut,
    StateName,
    TranscriptOut,
    VerificationAccepted,
    VerificationPage,
    VerificationStatus,
    VerifyBody,
)
from api.service import (
    API_PREFIX,
    DEFAULT_EMBEDDED_CONCURRENCY,
    BundleEntry,
    ServiceError,
    VerificationService,
    VerifySpec,
)
from shared.models import Verdict
from shared.response import VerifyResponse
from shared.settings import CouncilSettings
from shared.tiers import Tier

#: Request bodies above this many bytes are refused with 413 before they are parsed.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Paths that answer without the bearer token.
OPEN_PATHS = frozenset({"/healthz"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# Middleware (plain ASGI, so they run before any body is parsed) ------------------------


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: Any = ()) -> None:
    import json

    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class BearerAuthMiddleware:
    """When a token is configured, every path but /healthz needs `Authorization: Bearer`."""

    def __init__(self, app: ASGIApp, token: str, open_paths: frozenset[str] = OPEN_PATHS):
        self.app = app
        self.token = token.encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.open_paths:
            await self.app(scope, receive, send)
            return
        if not self.authorised(scope):
            await _send_json(
                send,
                401,
                {"detail": "missing or invalid bearer token (Authorization: Bearer <token>)"},
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)

    def authorised(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, rest = bytes(value).partition(b" ")
                if scheme.lower() == b"bearer":
                    given = rest.strip()
                break
        # Constant-time: the comparison takes as long whatever prefix matches.
        return secrets.compare_digest(given, self.token) and bool(given)


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`, whether announced by Content-Length or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers") or ():
            if name.lower() == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    await _send_json(send, 400, {"detail": "invalid Content-Length header"})
                    return
                if announced > self.max_bytes:
                    await self._too_large(send)
                    return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(body)
            more = bool(message.get("more_body"))
        replayed = False
        whole = b"".join(chunks)

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await _send_json(
            send, 413, {"detail": f"request body is larger than {self.max_bytes} bytes"}
        )


# Dependencies -------------------------------------------------------------------------


def get_settings(request: Request) -> CouncilSettings:
    settings: CouncilSettings = request.app.state.settings
    return settings


def get_service(request: Request) -> VerificationService:
    service: VerificationService = request.app.state.service
    return service


SettingsDep = Annotated[CouncilSettings, Depends(get_settings)]
ServiceDep = Annotated[VerificationService, Depends(get_service)]
VerificationId = Annotated[str, Path(description="The verification id.")]


def _utc(value: datetime | None) -> datetime | None:
    """A query time in UTC (naive means UTC); out-of-range times clamp to the ends."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return (datetime.min if value.year < 2 else datetime.max).replace(tzinfo=UTC)


def _spec(body: VerifyBody) -> VerifySpec:
    return VerifySpec(
        snapshot_id=body.snapshot_id,
        target_paths=tuple(body.target_paths) if body.target_paths is not None else None,
        tier=body.tier,
        rubric_focus=tuple(p.strip() for p in body.rubric_focus if p.strip()),
        confidence_threshold=body.confidence_threshold,
        repo=body.repo,
        bundle=(
            tuple(BundleEntry(f.path, f.content, f.executable) for f in body.bundle.files)
            if body.bundle is not None
            else None
        ),
        shuffle_seed=body.shuffle_seed,
    )


def _json(model: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=model.model_dump_json(),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing or wrong bearer token."},
    413: {"model": ErrorOut, "description": "Request body over the size limit."},
    422: {"model": ErrorOut, "description": "Invalid input; `field` names what was wrong."},
    503: {"model": ErrorOut, "description": "No council, broker or database available."},
}


# The app ------------------------------------------------------------------------------


def create_app(
    settings: CouncilSettings,
    *,
    service: VerificationService | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    embedded_concurrency: int = DEFAULT_EMBEDDED_CONCURRENCY,
    base_dir: FsPath | None = None,
) -> FastAPI:
    """Build the API. Opens the database (schema version checked) unless `service` is given."""
    if service is None:
        store = VerificationStore(open_database(settings, base_dir))
        service = VerificationService(settings, store, embedded_concurrency=embedded_concurrency)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(
        title="llm-council",
        version="0.1.0",
        summary="Verify a commit with a council of LLMs; one verdict gates CI.",
        lifespan=lifespan,
        responses=_ERRORS if settings.api_token else {k: v for k, v in _ERRORS.items() if k != 401},
    )
    app.state.settings = settings
    app.state.service = service

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.message, "field": exc.field}, status_code=exc.status_code
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ())]
            errors.append({"loc": loc, "msg": str(err.get("msg", "")), "type": err.get("type")})
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = [p for p in first["loc"] if p not in ("body", "query", "path", "header")]
        field = ".".join(where) or None
        detail = f"{field}: {first['msg']}" if field else str(first["msg"])
        return JSONResponse({"detail": detail, "field": field, "errors": errors}, 422)

    @app.post(
        f"{API_PREFIX}/verify",
        response_model=VerifyResponse,
        responses={
            202: {"model": VerificationAccepted, "description": "Accepted; poll status_url."},
        },
        summary="Verify a commit",
    )
    async def verify(
        body: VerifyBody,
        service: ServiceDep,
        wait: Annotated[
            bool | None, Query(description="Overrides the body's `wait` when given.")
        ] = None,
    ) -> Response:
        """Run the council on a commit of a repository on the server, or on inline files.

        `wait=true` (default) answers 200 with the verification payload when the run ends,
        at the latest at the tier's verify deadline (quick 60 s, balanced 180 s, high 360 s,
        reasoning 1200 s, times LLM_COUNCIL_TIMEOUT_MULTIPLIER). A FAIL is a 200 with
        `verdict: fail`: the HTTP status never hides the verdict. `wait=false` answers 202
        at once with the id and the status URL.
        """
        blocking = body.wait if wait is None else wait
        # Planning (git, transcript folder, database row) runs on the thread pool; waiting
        # for the payload holds no thread, so a long `wait=true` never starves other requests.
        plan, fut = await run_in_threadpool(
            partial(service.submit, _spec(body), source="api", wait=blocking)
        )
        if fut is not None and blocking:
            await asyncio.wait({asyncio.wrap_future(fut)}, timeout=service.wait_timeout(plan))
            result = service.outcome(plan, fut)
        else:
            result = service.accepted(plan)
        if isinstance(result, VerifyResponse):
            return _json(result)
        return _json(result, 202, {"Location": result.status_url})

    @app.get(
        f"{API_PREFIX}/verifications",
        response_model=VerificationPage,
        summary="List verifications",
    )
    def list_verifications(
        service: ServiceDep,
        verdict: Verdict | None = None,
        tier: Tier | None = None,
        state: StateName | None = None,
        snapshot: Annotated[
            str | None,
            Query(
                max_length=256,
                pattern=r"^[^\x00-\x1f\x7f]*$",
                description="Snapshot as asked, its sha, or a sha prefix.",
            ),
        ] = None,
        since: Annotated[datetime | None, Query(description="Created at or after (UTC).")] = None,
        until: Annotated[datetime | None, Query(description="Created before (UTC).")] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
    ) -> Response:
        """Newest first. Runs of `llm-council gate` appear once their transcript is indexed."""
        flt = VerificationFilter(
            verdict=verdict.value if verdict else None,
            tier=tier.value if tier else None,
            state=state,
            snapshot=snapshot or None,
            since=_utc(since),
            until=_utc(until),
        )
        return _json(service.list_verifications(flt, limit=limit, offset=offset))

    @app.get(
        f"{API_PREFIX}/verifications/{{verification_id}}",
        response_model=VerificationStatus,
        responses={404: {"model": ErrorOut}},
        summary="A verification's state, progress and payload",
    )
    def get_verification(verification_id: VerificationId, service: ServiceDep) -> Response:
        return _json(service.status(verification_id))

    @app.get(
        f"{API_PREFIX}/verifications/{{verification_id}}/transcript",
        response_model=TranscriptOut,
        responses={404: {"model": ErrorOut}},
        summary="A verification's transcript files",
    )
    def get_transcript(
        verification_id: VerificationId,
        service: ServiceDep,
        validate: Annotated[bool, Query(description="Check the integrity hashes.")] = False,
    ) -> Response:
        return _json(service.transcript(verification_id, validate=validate))

    @app.post(
        f"{API_PREFIX}/verifications/{{verification_id}}/dispositions",
        response_model=DispositionOut,
        status_code=201,
        responses={404: {"model": ErrorOut}},
        summary="Record a person's accept/reject of a verification or one finding",
    )
    def add_disposition(
        verification_id: VerificationId, body: DispositionIn, service: ServiceDep
    ) -> Response:
        return _json(service.add_disposition(verification_id, body), 201)

    @app.get(
        f"{API_PREFIX}/verifications/{{verification_id}}/dispositions",
        response_model=list[DispositionOut],
        responses={404: {"model": ErrorOut}},
        summary="Dispositions recorded for a verification",
    )
    def list_dispositions(verification_id: VerificationId, service: ServiceDep) -> Response:
        items = service.dispositions(verification_id)
        return Response(
            content="[" + ",".join(d.model_dump_json() for d in items) + "]",
            media_type="application/json",
        )

    @app.get(
        "/healthz",
        response_model=HealthOut,
        responses={503: {"model": HealthOut}},
        summary="Database (and Redis, when a broker is set) reachable",
    )
    def healthz(service: ServiceDep) -> Response:
        health = service.health()
        return _json(health, 200 if health.status == "ok" else 503)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text."}},
        summary="Prometheus metrics",
    )
    def metrics(service: ServiceDep) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(content=service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    if settings.api_token:
        _document_bearer(app)
        app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
        app.add_middleware(BearerAuthMiddleware, token=settings.api_token.get_secret_value())
    else:
        app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    return app


def _document_bearer(app: FastAPI) -> None:
    """Declare the bearer scheme in the OpenAPI document (the middleware enforces it)."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"}
        }
        for path, ops in schema.get("paths", {}).items():
            if path in OPEN_PATHS:
                continue
            for op in ops.values():
                op["security"] = [{"bearer": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
