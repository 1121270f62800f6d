"""The offline fake provider: a real HTTP server on loopback speaking two API shapes.

- OpenAI chat completions: `POST /v1/chat/completions` (base URL `url + "/v1"`).
- Anthropic Messages: `POST /v1/messages` (base URL `url`).

The model name (the API's `model` field, i.e. what follows the last ":" of a council model id)
selects a behaviour by prefix: `careful-a`, `lenient-2`, `slow-1500`, `flaky429`, ... (see
BEHAVIOURS below and the package docstring). Calls are counted per
(verification, stage, model) from the `X-LLM-Council-Verification` / `X-LLM-Council-Stage`
headers, falling back to the `COUNCIL STAGE: <stage>` line of the prompt. Every request is
recorded, so tests can assert "no duplicate call" and "no secret left the machine".

Admin endpoints (JSON): `GET /admin/calls`, `GET /admin/prompts`, `GET /admin/config`,
`POST /admin/config`, `POST /admin/reset`, `GET /admin/health`.

Started in-process by `llm-council gate --offline`, so this module imports only the standard
library (no pydantic, no httpx) and starts in a few milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import selectors
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ops.fake_provider import detectors

#: Mirrors shared/providers/base.py (not imported: it pulls in pydantic).
HEADER_VERIFICATION = "X-LLM-Council-Verification"
HEADER_STAGE = "X-LLM-Council-Stage"
#: Mirrors shared/providers/client.py: the attempt number (1, 2, ...) of a retried call.
HEADER_ATTEMPT = "X-LLM-Council-Attempt"

STAGES = ("stage1", "stage2", "chairman")
#: Mirrors shared/models.py RUBRIC_DIMENSIONS.
RUBRIC_DIMENSIONS = ("accuracy", "relevance", "completeness", "conciseness", "clarity")
UNKNOWN = "unknown"

#: Behaviours selected by model-name prefix (longest prefix wins).
BEHAVIOURS = (
    "careful",
    "lenient",
    "unsure",
    "contradict",
    "prose",
    "slow",
    "flaky429always",
    "flaky429",
    "flaky500always",
    "flaky500",
    "hang",
    "malformed",
    "truncated",
    "auth401",
    "billing402",
    "error200",
)
#: Extra behaviours only for injected faults (`POST /admin/config`).
FAULT_BEHAVIOURS = ("http500", "http429")

DEFAULT_SLOW_MS = 2000
HANG_MAX_S = 600.0
CACHE_MIN_CHARS = 1024
CACHE_BUCKET_KEEP = 32
FLAKY_RETRY_AFTER = {"retry-after": "1", "retry-after-ms": "50"}
MALFORMED_TEXT = "{verdict: 'pass', confidence: high,, findings: [oops}"

Json = dict[str, Any]
CallKey = tuple[str, str, str]

_BEHAVIOUR_RE = re.compile(
    r"^(?P<name>" + "|".join(sorted(BEHAVIOURS + FAULT_BEHAVIOURS, key=len, reverse=True)) + r")"
    r"(?:[-_]?(?P<param>\d+))?"
)


def parse_behaviour(model: str) -> tuple[str, int | None] | None:
    """(behaviour, numeric parameter) selected by a model name, or None if unknown.

    The part after the last ":" and "/" counts, so `fake/careful-a` and `careful-a` agree.
    """
    name = model.rsplit(":", 1)[-1].rsplit("/", 1)[-1].strip().lower()
    m = _BEHAVIOUR_RE.match(name)
    if not m:
        return None
    behaviour, param = m.group("name"), m.group("param")
    if behaviour not in ("slow", "hang"):  # only these take a number: `lenient-2` is a name
        return behaviour, None
    return behaviour, int(param) if param else None


def _tokens(text_len: int) -> int:
    return text_len // 4


def _lcp(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over C-speed slice compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _Fault:
    __slots__ = ("behaviour", "param", "stages", "times")

    def __init__(
        self, behaviour: str, param: int | None, stages: frozenset[str] | None, times: int | None
    ) -> None:
        self.behaviour = behaviour
        self.param = param
        self.stages = stages
        self.times = times

    def as_json(self) -> Json:
        name = self.behaviour if self.param is None else f"{self.behaviour}-{self.param}"
        return {
            "behaviour": name,
            "stages": None if self.stages is None else sorted(self.stages),
            "times": self.times,
        }


class _Request:
    """A parsed chat request in either API shape."""

    __slots__ = (
        "api",
        "cache_control",
        "cacheable_chars",
        "max_tokens",
        "model",
        "prompt",
        "system",
    )

    def __init__(
        self,
        api: str,
        model: str,
        system: str,
        prompt: str,
        max_tokens: int | None,
        cache_control: bool = False,
        cacheable_chars: int = 0,
    ) -> None:
        self.api = api
        self.model = model
        self.system = system
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.cache_control = cache_control
        self.cacheable_chars = cacheable_chars  # chars of full_text up to the last breakpoint

    @property
    def full_text(self) -> str:
        return f"{self.system}\n{self.prompt}"


class _Reply:
    """What to send back: status, JSON body (or None to drop the connection), headers."""

    __slots__ = ("body", "completed", "headers", "status")

    def __init__(
        self,
        status: int,
        body: Json | None,
        headers: Mapping[str, str] | None = None,
        completed: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers or {})
        self.completed = completed


# --- request parsing -----------------------------------------------------------------------


def _text_of(content: Any, where: str) -> tuple[str, list[tuple[int, bool]]]:
    """Text of a message content (string or list of text blocks) and, per block, its end
    offset and whether it carried `cache_control`."""
    if isinstance(content, str):
        return content, [(len(content), False)]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: content must be a string or a list of content blocks")
    parts: list[str] = []
    marks: list[tuple[int, bool]] = []
    offset = 0
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise BadRequest(f"{where}.{i}: content block must be an object")
        if block.get("type") != "text":
            continue  # images and other blocks carry no text for the fake reviewer
        text = block.get("text")
        if not isinstance(text, str):
            raise BadRequest(f"{where}.{i}.text: Field required (a string)")
        parts.append(text)
        offset += len(text)
        marks.append((offset, "cache_control" in block))
    return "".join(parts), marks


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{name}: must be a positive integer")
    return value


def parse_openai(body: Any) -> _Request:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter")
    if body.get("stream"):
        raise BadRequest("stream: the fake provider does not support streaming")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty array")
    rf = body.get("response_format")
    if rf is not None and (
        not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema")
    ):
        raise BadRequest("response_format: type must be text, json_object or json_schema")
    system: list[str] = []
    user: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}]: must be an object with a role")
        text, _ = _text_of(msg.get("content", ""), f"messages[{i}].content")
        if msg["role"] in ("system", "developer"):
            system.append(text)
        elif msg["role"] == "user":
            user.append(text)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        max_tokens = _positive_int(max_tokens, "max_tokens")
    return _Request("openai", model, "\n\n".join(system), "\n\n".join(user), max_tokens)


def parse_anthropic(body: Any) -> _Request:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required")
    if "max_tokens" not in body:
        raise BadRequest("max_tokens: Field required")
    max_tokens = _positive_int(body["max_tokens"], "max_tokens")
    if body.get("stream"):
        raise BadRequest("stream: the fake provider does not support streaming")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty array")
    system, sys_marks = _text_of(body.get("system", ""), "system")
    cacheable = 0
    cache_control = False
    for end, marked in sys_marks:
        if marked:
            cache_control = True
            cacheable = end
    user: list[str] = []
    offset = len(system) + 1  # full_text = system + "\n" + prompt
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise BadRequest(f"messages.{i}.role: must be 'user' or 'assistant'")
        text, marks = _text_of(msg.get("content", ""), f"messages.{i}.content")
        if msg["role"] != "user":
            continue
        if user:
            offset += 2  # the "\n\n" joining user messages
        for end, marked in marks:
            if marked:
                cache_control = True
                cacheable = offset + end
        user.append(text)
        offset += len(text)
    return _Request(
        "anthropic", model, system, "\n\n".join(user), max_tokens, cache_control, cacheable
    )


# --- the fake reviewers --------------------------------------------------------------------


def _scores(value: float) -> Json:
    return {d: value for d in RUBRIC_DIMENSIONS}


def _label_key(label: str) -> tuple[int, str]:
    return len(label), label


def review_stage1(prompt: str, confidence: float = 0.9) -> Json:
    files = detectors.parse_files(prompt)
    findings = detectors.detect(files)
    critical = [f for f in findings if f["severity"] == "critical"]
    if findings:
        summary = (
            f"Found {len(findings)} defect(s), {len(critical)} critical, at "
            + ", ".join(str(f["location"]) for f in findings)
            + "."
        )
    else:
        summary = f"No defects found in {len(files)} file(s)."
    return {
        "verdict": "fail" if critical else "pass",
        "confidence": confidence,
        "summary": summary,
        "findings": findings,
    }


def review_stage2(prompt: str) -> Json:
    own = {f["location"] for f in detectors.detect(prompt)}
    rows: list[tuple[int, bool, tuple[int, str], str]] = []
    scores: Json = {}
    for label, body in detectors.parse_responses(prompt):
        answer = detectors.load_json_object(body)
        reported = detectors.finding_locations(answer)
        hits = len(own & reported)
        invalid = answer is None
        if invalid:
            accuracy = 0.0
        elif own:
            accuracy = round(10.0 * hits / len(own), 1)
        else:
            accuracy = 10.0 if not reported else 6.0
        rows.append((-hits, invalid, _label_key(label), label))
        scores[f"Response {label}"] = {
            "accuracy": accuracy,
            "relevance": 0.0 if invalid else 8.0,
            "completeness": accuracy,
            "conciseness": 0.0 if invalid else 8.0,
            "clarity": 0.0 if invalid else 8.0,
        }
    rows.sort()
    return {"ranking": [f"Response {r[3]}" for r in rows], "scores": scores, "findings": []}


def review_chairman(prompt: str, confidence: float = 0.9) -> Json:
    findings = detectors.detect(prompt)
    critical = [f for f in findings if f["severity"] == "critical"]
    if findings:
        rationale = f"Confirmed {len(findings)} defect(s), {len(critical)} critical."
    else:
        rationale = "No defect confirmed in the reviewed files."
    return {
        "verdict": "fail" if critical else "pass",
        "confidence": confidence,
        "rationale": rationale,
        "findings": findings,
        "rubric_scores": _scores(9.0),
    }


def lenient_answer(stage: str, prompt: str) -> Json:
    if stage == "stage2":
        labels = [label for label, _ in detectors.parse_responses(prompt)]
        return {
            "ranking": [f"Response {x}" for x in labels],
            "scores": {f"Response {x}": _scores(8.0) for x in labels},
            "findings": [],
        }
    if stage == "chairman":
        return {
            "verdict": "pass",
            "confidence": 0.8,
            "rationale": "The reviewers found nothing that blocks this change.",
            "findings": [],
            "rubric_scores": _scores(8.0),
        }
    return {"verdict": "pass", "confidence": 0.8, "summary": "Looks good to me.", "findings": []}


def answer_for(reviewer: str, stage: str, prompt: str) -> Json:
    """The JSON answer of a reviewer kind (careful, lenient, unsure, contradict) at a stage."""
    if reviewer == "lenient":
        return lenient_answer(stage, prompt)
    confidence = 0.3 if reviewer == "unsure" else 0.9
    if stage == "stage2":
        return review_stage2(prompt)
    if stage == "chairman":
        if reviewer == "contradict":
            return {
                "verdict": "fail",
                "confidence": 0.9,
                "rationale": "I would not merge this change.",
                "findings": [],
                "rubric_scores": _scores(5.0),
            }
        return review_chairman(prompt, confidence)
    return review_stage1(prompt, confidence)


def _dumps(payload: Json) -> str:
    return json.dumps(payload, ensure_ascii=False)


# --- error bodies --------------------------------------------------------------------------

_OPENAI_ERRORS: dict[str, tuple[int, str, str | None]] = {
    "bad_request": (400, "invalid_request_error", None),
    "auth": (401, "invalid_request_error", "invalid_api_key"),
    "not_found": (404, "invalid_request_error", "model_not_found"),
    "method": (405, "invalid_request_error", "method_not_allowed"),
    "rate_limit": (429, "requests", "rate_limit_exceeded"),
    "server": (500, "server_error", None),
}
_ANTHROPIC_ERRORS: dict[str, tuple[int, str]] = {
    "bad_request": (400, "invalid_request_error"),
    "auth": (401, "authentication_error"),
    "not_found": (404, "not_found_error"),
    "method": (405, "invalid_request_error"),
    "rate_limit": (429, "rate_limit_error"),
    "server": (500, "api_error"),
}


def error_reply(
    api: str, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> _Reply:
    """An error in the API's own shape (kind: bad_request|auth|not_found|rate_limit|server)."""
    if kind == "billing":
        if api == "anthropic":
            body: Json = {
                "type": "error",
                "error": {"type": "billing_error", "message": "Your credit balance is too low"},
            }
        else:
            body = {
                "error": {
                    "code": 402,
                    "message": "Insufficient credits. Add more using "
                    "https://openrouter.ai/settings/credits",
                    "metadata": {},
                }
            }
        return _Reply(402, body, headers)
    if api == "anthropic":
        status, type_ = _ANTHROPIC_ERRORS[kind]
        return _Reply(
            status, {"type": "error", "error": {"type": type_, "message": message}}, headers
        )
    status, type_, code = _OPENAI_ERRORS[kind]
    return _Reply(status, {"error": {"message": message, "type": type_, "code": code}}, headers)


# --- the provider --------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # keep-alive handler threads must not block stop()
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], provider: FakeProvider) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.provider = provider
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup: skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away is not worth a traceback on stderr


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once: no 40 ms delayed-ACK stall
    server_version = "llm-council-fake-provider/1"
    sys_version = ""
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.connections_lock:
                self.server.connections.discard(self.connection)

    def do_GET(self) -> None:
        self.server.provider._dispatch(self, "GET")

    def do_POST(self) -> None:
        self.server.provider._dispatch(self, "POST")

    def do_PUT(self) -> None:
        self.server.provider._dispatch(self, "PUT")

    def do_DELETE(self) -> None:
        self.server.provider._dispatch(self, "DELETE")

    def read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send_reply(self, reply: _Reply) -> None:
        if reply.body is None:  # drop the connection without an answer (hang, stop)
            self.close_connection = True
            return
        data = json.dumps(reply.body, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True


class FakeProvider:
    """The fake provider server. Start it, point model ids at `.openai_base` or
    `.anthropic_base`, and read `.calls()` / `.prompts()` afterwards."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._started_at = 0.0
        self._reset_state()
        self._latency_ms = 0
        self._rps_limit: float | None = None
        self._faults: dict[str, _Fault] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeProvider:
        if self._httpd is not None:
            raise RuntimeError("fake provider already started")
        self._stop.clear()
        self._httpd = _Server((self.host, self.port), self)
        self._httpd.timeout = 0
        self.port = int(self._httpd.server_address[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._started_at = time.monotonic()
        self._thread = threading.Thread(
            target=self._serve, name=f"fake-provider:{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def _serve(self) -> None:
        httpd, wake = self._httpd, self._wake_r
        assert httpd is not None and wake is not None
        with selectors.DefaultSelector() as sel:
            sel.register(httpd.socket, selectors.EVENT_READ, "accept")
            sel.register(wake, selectors.EVENT_READ, "wake")
            while not self._stop.is_set():
                for key, _ in sel.select():
                    if key.data == "wake":
                        return
                    httpd.handle_request()

    def stop(self) -> None:
        """Stop serving, release hanging and slow calls, close every open connection."""
        httpd = self._httpd
        if httpd is None:
            return
        self._stop.set()
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        httpd.server_close()
        with httpd.connections_lock:
            conns = list(httpd.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._httpd = self._thread = self._wake_r = self._wake_w = None

    def __enter__(self) -> FakeProvider:
        if self._httpd is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def openai_base(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base(self) -> str:
        return self.url

    def model_id(self, model: str, shape: str = "openai") -> str:
        """A council model id pointing at this server, e.g. `openai-compat@http://...:careful`."""
        if shape == "anthropic":
            return f"anthropic@{self.anthropic_base}:{model}"
        return f"openai-compat@{self.openai_base}:{model}"

    # --- state and configuration -------------------------------------------------------------

    def _reset_state(self) -> None:
        self._counts: dict[CallKey, list[int]] = {}
        self._prompts: list[Json] = []
        self._cache: dict[str, dict[str, deque[str]]] = {}
        self._flaky_seen: set[tuple[str, CallKey]] = set()
        self._rps_window: deque[float] = deque()
        self._requests = 0
        self._ids = 0

    def reset(self, *, keep_config: bool = False) -> None:
        """Forget calls, prompts, cache and flaky state; also the config unless kept."""
        with self._lock:
            self._reset_state()
            if not keep_config:
                self._latency_ms = 0
                self._rps_limit = None
                self._faults = {}

    def configure(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Json:
        """Apply `{"latency_ms", "rps_limit", "faults"}` (the body of POST /admin/config).

        Keys left out keep their value; `faults` replaces every fault. A fault is
        `{MODEL: {"behaviour": NAME, "stages": [..] | None, "times": int | None}}`; MODEL is
        the API model name, or "*" for every model. Raises ValueError on a bad config.
        """
        cfg = {**(config or {}), **kwargs}
        unknown = set(cfg) - {"latency_ms", "rps_limit", "faults"}
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(sorted(unknown))}")
        latency = self._latency_ms
        if "latency_ms" in cfg:
            latency = cfg["latency_ms"]
            if isinstance(latency, bool) or not isinstance(latency, int) or latency < 0:
                raise ValueError("latency_ms: must be an integer >= 0")
        rps = self._rps_limit
        if "rps_limit" in cfg:
            rps = cfg["rps_limit"]
            if rps is not None and (
                isinstance(rps, bool) or not isinstance(rps, int | float) or rps <= 0
            ):
                raise ValueError("rps_limit: must be a number > 0 or null")
            rps = None if rps is None else float(rps)
        faults = self._faults
        if "faults" in cfg:
            faults = self._parse_faults(cfg["faults"])
        with self._lock:
            self._latency_ms = latency
            self._rps_limit = rps
            self._faults = faults
        return self.config()

    @staticmethod
    def _parse_faults(raw: Any) -> dict[str, _Fault]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ValueError("faults: must be an object {MODEL: {behaviour, stages, times}}")
        out: dict[str, _Fault] = {}
        for model, spec in raw.items():
            if isinstance(spec, str):
                spec = {"behaviour": spec}
            if not isinstance(spec, dict):
                raise ValueError(f"faults.{model}: must be an object")
            extra = set(spec) - {"behaviour", "stages", "times"}
            if extra:
                raise ValueError(f"faults.{model}: unknown keys {', '.join(sorted(extra))}")
            name = spec.get("behaviour")
            parsed = parse_behaviour(name) if isinstance(name, str) else None
            if parsed is None:
                raise ValueError(
                    f"faults.{model}.behaviour: {name!r} is not one of "
                    f"{', '.join(BEHAVIOURS + FAULT_BEHAVIOURS)}"
                )
            stages = spec.get("stages")
            if stages is not None and (
                not isinstance(stages, list) or not all(isinstance(s, str) for s in stages)
            ):
                raise ValueError(f"faults.{model}.stages: must be a list of stage names or null")
            times = spec.get("times")
            if times is not None and (
                isinstance(times, bool) or not isinstance(times, int) or times < 0
            ):
                raise ValueError(f"faults.{model}.times: must be an integer >= 0 or null")
            out[str(model)] = _Fault(
                parsed[0], parsed[1], None if stages is None else frozenset(stages), times
            )
        return out

    def config(self) -> Json:
        with self._lock:
            return {
                "latency_ms": self._latency_ms,
                "rps_limit": self._rps_limit,
                "faults": {m: f.as_json() for m, f in self._faults.items()},
            }

    def calls(
        self, verification: str | None = None, stage: str | None = None, model: str | None = None
    ) -> list[Json]:
        """`[{verification, stage, model, calls, completed}]`, sorted, optionally filtered."""
        with self._lock:
            items = sorted(self._counts.items())
        return [
            {"verification": v, "stage": s, "model": m, "calls": c[0], "completed": c[1]}
            for (v, s, m), c in items
            if (verification is None or v == verification)
            and (stage is None or s == stage)
            and (model is None or m == model)
        ]

    def prompts(
        self, verification: str | None = None, stage: str | None = None, model: str | None = None
    ) -> list[Json]:
        """Every recorded request `{verification, stage, model, api, system, prompt, headers,
        cache_control, attempt}` in arrival order, optionally filtered. `headers` holds the
        two council headers as sent; `attempt` is the X-LLM-Council-Attempt number or None."""
        with self._lock:
            items = list(self._prompts)
        return [
            dict(p)
            for p in items
            if (verification is None or p["verification"] == verification)
            and (stage is None or p["stage"] == stage)
            and (model is None or p["model"] == model)
        ]

    def health(self) -> Json:
        with self._lock:
            requests = self._requests
        return {
            "status": "ok",
            "url": self.url,
            "uptime_s": round(time.monotonic() - self._started_at, 3),
            "requests": requests,
            "behaviours": list(BEHAVIOURS),
        }

    # --- HTTP dispatch -----------------------------------------------------------------------

    def _dispatch(self, h: _Handler, method: str) -> None:
        path = h.path.split("?", 1)[0].rstrip("/") or "/"
        api = "anthropic" if path == "/v1/messages" else "openai"
        try:
            body_bytes = h.read_body()
        except (OSError, ValueError):
            h.close_connection = True
            return
        try:
            if path.startswith("/admin/"):
                reply = self._admin(method, path, body_bytes)
            elif path in ("/v1/chat/completions", "/v1/messages"):
                if method != "POST":
                    reply = error_reply(api, "method", f"{method} {path}: use POST")
                else:
                    reply = self._api(h, api, body_bytes)
            elif path == "/v1/models" and method == "GET":
                reply = _Reply(
                    200,
                    {
                        "object": "list",
                        "data": [{"id": b, "object": "model"} for b in BEHAVIOURS],
                    },
                )
            else:
                reply = error_reply(api, "not_found", f"no route for {method} {path}")
        except Exception as exc:  # never let a handler die without an answer
            reply = error_reply(api, "server", f"fake provider error: {exc!r}")
        h.send_reply(reply)

    def _admin(self, method: str, path: str, body_bytes: bytes) -> _Reply:
        route = (method, path)
        if route == ("GET", "/admin/calls"):
            return _Reply(200, {"calls": self.calls()})
        if route == ("GET", "/admin/prompts"):
            return _Reply(200, {"prompts": self.prompts()})
        if route == ("GET", "/admin/health"):
            return _Reply(200, self.health())
        if route == ("GET", "/admin/config"):
            return _Reply(200, self.config())
        if route == ("POST", "/admin/reset"):
            self.reset()
            return _Reply(200, {"ok": True})
        if route == ("POST", "/admin/config"):
            try:
                cfg = json.loads(body_bytes or b"{}")
                if not isinstance(cfg, dict):
                    raise ValueError("config must be a JSON object")
                return _Reply(200, self.configure(cfg))
            except ValueError as exc:
                return _Reply(400, {"error": {"message": str(exc), "type": "bad_config"}})
        return _Reply(404, {"error": {"message": f"no admin route {method} {path}"}})

    # --- the chat APIs -----------------------------------------------------------------------

    def _api(self, h: _Handler, api: str, body_bytes: bytes) -> _Reply:
        try:
            body = json.loads(body_bytes)
        except ValueError as exc:
            return error_reply(api, "bad_request", f"request body is not valid JSON: {exc}")
        try:
            req = parse_anthropic(body) if api == "anthropic" else parse_openai(body)
        except BadRequest as exc:
            return error_reply(api, "bad_request", str(exc))

        verification = (h.headers.get(HEADER_VERIFICATION) or "").strip() or UNKNOWN
        header_stage = (h.headers.get(HEADER_STAGE) or "").strip()
        marker_stage = detectors.parse_stage(req.prompt)
        stage = header_stage or marker_stage or UNKNOWN
        answer_stage = next((s for s in (header_stage, marker_stage) if s in STAGES), "stage1")
        key: CallKey = (verification, stage, req.model)
        recorded_headers = {
            name: h.headers[name]
            for name in (HEADER_VERIFICATION, HEADER_STAGE)
            if name in h.headers
        }

        raw_attempt = (h.headers.get(HEADER_ATTEMPT) or "").strip()
        attempt = int(raw_attempt) if raw_attempt.isdigit() else None

        now = time.monotonic()
        with self._lock:
            self._requests += 1
            self._counts.setdefault(key, [0, 0])[0] += 1
            self._prompts.append(
                {
                    "verification": verification,
                    "stage": stage,
                    "model": req.model,
                    "api": api,
                    "system": req.system,
                    "prompt": req.prompt,
                    "headers": recorded_headers,
                    "cache_control": req.cache_control,
                    "attempt": attempt,
                }
            )
            limited = self._rate_limited(now)
            latency_ms = self._latency_ms
            # a rate-limited request never reaches the model: it consumes no fault
            behaviour = None if limited is not None else self._behaviour_for(req.model, stage)

        if limited is not None:
            return error_reply(
                api,
                "rate_limit",
                "Rate limit reached for requests",
                {
                    "retry-after": str(max(1, math.ceil(limited))),
                    "retry-after-ms": str(max(1, math.ceil(limited * 1000))),
                },
            )
        if latency_ms and self._stop.wait(latency_ms / 1000.0):
            return _Reply(503, None)
        if behaviour is None:
            return error_reply(
                api,
                "not_found",
                f"The model '{req.model}' does not exist (fake provider behaviours: "
                f"{', '.join(BEHAVIOURS)})",
            )
        reply = self._behave(behaviour, key, api, req, answer_stage)
        if reply.completed:
            with self._lock:
                counts = self._counts.get(key)
                if counts is not None:
                    counts[1] += 1
        return reply

    def _rate_limited(self, now: float) -> float | None:
        """Seconds until the next slot if over the rps limit, else None (lock held)."""
        limit = self._rps_limit
        if limit is None:
            return None
        window, capacity = (1.0, int(limit)) if limit >= 1 else (1.0 / limit, 1)
        q = self._rps_window
        while q and q[0] <= now - window:
            q.popleft()
        if len(q) >= capacity:
            return q[0] + window - now
        q.append(now)
        return None

    def _behaviour_for(self, model: str, stage: str) -> tuple[str, int | None] | None:
        """The injected fault if one applies (consuming one of its `times`), else the model's
        own behaviour (lock held)."""
        fault = self._faults.get(model) or self._faults.get("*")
        if (
            fault is not None
            and (fault.stages is None or stage in fault.stages)
            and (fault.times is None or fault.times > 0)
        ):
            if fault.times is not None:
                fault.times -= 1
            return fault.behaviour, fault.param
        return parse_behaviour(model)

    def _first_call(self, kind: str, key: CallKey) -> bool:
        with self._lock:
            if (kind, key) in self._flaky_seen:
                return False
            self._flaky_seen.add((kind, key))
            return True

    def _behave(
        self, behaviour: tuple[str, int | None], key: CallKey, api: str, req: _Request, stage: str
    ) -> _Reply:
        name, param = behaviour
        if name == "hang":
            self._stop.wait(HANG_MAX_S if param is None else param / 1000.0)
            return _Reply(503, None)  # no answer: the client times out or sees a closed socket
        if name == "slow" and self._stop.wait(
            (DEFAULT_SLOW_MS if param is None else param) / 1000.0
        ):
            return _Reply(503, None)
        if (
            name == "http429"
            or name == "flaky429always"
            or (name == "flaky429" and self._first_call("429", key))
        ):
            return error_reply(
                api, "rate_limit", "Rate limit reached for requests", FLAKY_RETRY_AFTER
            )
        if (
            name == "http500"
            or name == "flaky500always"
            or (name == "flaky500" and self._first_call("500", key))
        ):
            return error_reply(api, "server", "The server had an error processing your request")
        if name == "auth401":
            return error_reply(
                api,
                "auth",
                "invalid x-api-key" if api == "anthropic" else "Incorrect API key provided",
            )
        if name == "billing402":
            return error_reply(api, "billing", "")
        if name == "error200":
            return _Reply(200, {"error": {"code": 502, "message": "upstream error"}})

        reviewer = name if name in ("lenient", "unsure", "contradict") else "careful"
        text = _dumps(answer_for(reviewer, stage, req.prompt))
        truncated = False
        if name == "malformed":
            text = MALFORMED_TEXT
        elif name == "truncated":
            text = text[: len(text) // 2]
            truncated = True
        elif name == "prose":
            text = (
                "Here is my review of the change.\n\n```json\n"
                + text
                + "\n```\n\nLet me know if you want more detail."
            )
        if req.max_tokens is not None and _tokens(len(text)) > req.max_tokens:
            text = text[: req.max_tokens * 4]
            truncated = True
        return self._completion(api, req, text, truncated)

    def _cache_lookup(self, model: str, text: str) -> int:
        """Chars of `text` shared as a prefix with an earlier prompt of the model (>= 1024),
        and remember `text` for later calls."""
        if len(text) < CACHE_MIN_CHARS:
            return 0
        bucket_key = text[:CACHE_MIN_CHARS]
        with self._lock:
            bucket = self._cache.setdefault(model, {}).setdefault(
                bucket_key, deque(maxlen=CACHE_BUCKET_KEEP)
            )
            best = max((_lcp(text, earlier) for earlier in bucket), default=0)
            if text not in bucket:
                bucket.append(text)
        return best if best >= CACHE_MIN_CHARS else 0

    def _completion(self, api: str, req: _Request, text: str, truncated: bool) -> _Reply:
        full = req.full_text
        cached_chars = self._cache_lookup(req.model, full)
        prompt_tokens = _tokens(len(full))
        cached = _tokens(cached_chars)
        completion_tokens = _tokens(len(text))
        with self._lock:
            self._ids += 1
            n = self._ids
        if api == "anthropic":
            creation = 0
            if req.cache_control and req.cacheable_chars >= CACHE_MIN_CHARS:
                creation = _tokens(max(0, req.cacheable_chars - cached_chars))
            body: Json = {
                "id": f"msg_fake_{n:08d}",
                "type": "message",
                "role": "assistant",
                "model": req.model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "max_tokens" if truncated else "end_turn",
                "stop_sequence": None,
                "usage": {
                    "input_tokens": max(0, prompt_tokens - cached - creation),
                    "output_tokens": completion_tokens,
                    "cache_read_input_tokens": cached,
                    "cache_creation_input_tokens": creation,
                },
            }
        else:
            body = {
                "id": f"chatcmpl-fake{n:08d}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length" if truncated else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
            }
        return _Reply(200, body, completed=True)
