"""The HTTP provider client against `httpx.MockTransport`: request shapes, usage, error
classes, retries, deadlines. No network."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate
from typing import Any

import httpx
import pytest

from shared.models import Stage
from shared.providers import http as pooled
from shared.providers.base import HEADER_STAGE, HEADER_VERIFICATION, CallMeta, ProviderError
from shared.providers.client import (
    HEADER_ATTEMPT,
    HttpProviderClient,
    ProviderKeys,
    missing_credentials,
)
from shared.providers.errors import (
    failure_from_response,
    is_retryable,
    retry_after_s,
    scrub_message,
)
from shared.providers.refs import parse_model_ref
from shared.settings import CouncilSettings

KEYS = ProviderKeys(
    openrouter="sk-or-v1-test-openrouter-key",
    openai="sk-test-openai-key-123456",
    anthropic="sk-ant-test-anthropic-key",
)
SCHEMA: dict[str, object] = {"type": "object", "properties": {"verdict": {"enum": ["pass"]}}}
OPENROUTER_ANTHROPIC = "openrouter:anthropic/claude-sonnet-4.5"
OPENROUTER_OTHER = "openrouter:openai/gpt-5.1"


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that records requests and replays scripted responses."""

    def __init__(self, *responses: httpx.Response | Exception | Handler) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []
        self.clock: FakeClock | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.clock is not None:
            self.times.append(self.clock.now)
        item = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(item, Exception):
            raise item
        if callable(item) and not isinstance(item, httpx.Response):
            return item(request)
        return item

    def body(self, i: int = -1) -> dict[str, Any]:
        return json.loads(self.requests[i].content)


def make(
    recorder: Recorder, *, keys: ProviderKeys = KEYS, clock: FakeClock | None = None, **kw: Any
) -> tuple[HttpProviderClient, FakeClock]:
    clock = clock or FakeClock()
    recorder.clock = clock
    http = httpx.Client(transport=httpx.MockTransport(recorder))
    client = HttpProviderClient(
        keys, http=http, sleep=clock.sleep, clock=clock, rand=lambda: 0.5, **kw
    )
    return client, clock


def call(
    client: HttpProviderClient,
    ref: str = OPENROUTER_OTHER,
    *,
    schema: dict[str, object] | None = SCHEMA,
    prefix: str = "PREFIX-",
    prompt: str = "PROMPT",
    timeout_s: float = 30.0,
    deadline_at: float | None = None,
    stage: Stage = Stage.STAGE1,
):
    return client.complete(
        parse_model_ref(ref),
        system="SYSTEM",
        cacheable_prefix=prefix,
        prompt=prompt,
        schema=schema,
        schema_name="council_stage1",
        timeout_s=timeout_s,
        deadline_at=deadline_at,
        meta=CallMeta(verification_id="ver-1", stage=stage),
    )


def chat_ok(text: str = '{"verdict": "pass"}', **extra: Any) -> httpx.Response:
    body = {
        "id": "gen-1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 1200,
            "completion_tokens": 80,
            "prompt_tokens_details": {"cached_tokens": 1024},
        },
        **extra,
    }
    return httpx.Response(200, json=body)


def messages_ok(text: str = '{"verdict": "pass"}', stop: str = "end_turn") -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "type": "message",
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop,
            "usage": {
                "input_tokens": 10,
                "output_tokens": 50,
                "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 100,
            },
        },
    )


def error(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    if isinstance(body, str):
        return httpx.Response(status, text=body, headers=headers)
    return httpx.Response(status, json=body, headers=headers)


# --- request shapes ------------------------------------------------------------------------


def test_openai_request_shape_and_usage():
    rec = Recorder(chat_ok())
    client, _ = make(rec)
    done = call(client, "openai:gpt-5.1", stage=Stage.STAGE2)
    req = rec.requests[0]
    assert str(req.url) == "https://api.openai.com/v1/chat/completions"
    assert req.method == "POST"
    assert req.headers["authorization"] == "Bearer sk-test-openai-key-123456"
    assert req.headers[HEADER_VERIFICATION] == "ver-1"
    assert req.headers[HEADER_STAGE] == "stage2"
    assert req.headers[HEADER_ATTEMPT] == "1"
    body = rec.body()
    assert body["model"] == "gpt-5.1"
    assert body["messages"] == [
        {"role": "system", "content": "SYSTEM"},
        {"role": "user", "content": "PREFIX-PROMPT"},
    ]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "council_stage1", "schema": SCHEMA, "strict": False},
    }
    assert done.text == '{"verdict": "pass"}'
    assert done.finish_reason == "stop"
    assert done.attempts == 1
    assert done.usage.prompt_tokens == 1200
    assert done.usage.completion_tokens == 80
    assert done.usage.cached_tokens == 1024


def test_openai_without_schema_sends_no_response_format():
    rec = Recorder(chat_ok())
    client, _ = make(rec)
    call(client, schema=None)
    assert "response_format" not in rec.body()


def test_openrouter_anthropic_model_marks_prefix_cacheable():
    rec = Recorder(chat_ok())
    client, _ = make(rec)
    call(client, OPENROUTER_ANTHROPIC)
    assert str(rec.requests[0].url) == "https://openrouter.ai/api/v1/chat/completions"
    assert rec.requests[0].headers["authorization"] == "Bearer sk-or-v1-test-openrouter-key"
    assert rec.body()["messages"][1]["content"] == [
        {"type": "text", "text": "PREFIX-", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "PROMPT"},
    ]


def test_openai_compat_sends_no_authorization_without_a_key():
    rec = Recorder(chat_ok())
    client, _ = make(rec)
    call(client, "openai-compat@http://127.0.0.1:11434/v1:llama3:8b")
    req = rec.requests[0]
    assert str(req.url) == "http://127.0.0.1:11434/v1/chat/completions"
    assert "authorization" not in req.headers
    assert rec.body()["model"] == "llama3:8b"


def test_openai_compat_key_is_sent_when_configured():
    rec = Recorder(chat_ok())
    client, _ = make(rec, keys=ProviderKeys(openai_compat="local-secret"))
    call(client, "openai-compat@http://127.0.0.1:8000/v1:m")
    assert rec.requests[0].headers["authorization"] == "Bearer local-secret"


def test_anthropic_request_shape_and_usage():
    rec = Recorder(messages_ok())
    client, _ = make(rec)
    done = call(client, "anthropic:claude-opus-4.5", stage=Stage.CHAIRMAN)
    req = rec.requests[0]
    assert str(req.url) == "https://api.anthropic.com/v1/messages"
    assert req.headers["x-api-key"] == "sk-ant-test-anthropic-key"
    assert req.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in req.headers
    assert req.headers[HEADER_STAGE] == "chairman"
    assert req.headers[HEADER_VERIFICATION] == "ver-1"
    body = rec.body()
    assert body["model"] == "claude-opus-4.5"
    assert body["max_tokens"] == 8192
    assert body["system"] == "SYSTEM"
    assert "response_format" not in body
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "PREFIX-", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "PROMPT"},
            ],
        }
    ]
    assert done.text == '{"verdict": "pass"}'
    assert done.finish_reason == "stop"
    assert done.usage.prompt_tokens == 1010  # input + cache read + cache write
    assert done.usage.completion_tokens == 50
    assert done.usage.cached_tokens == 900
    assert done.usage.cache_write_tokens == 100


def test_anthropic_empty_prefix_is_one_block_without_cache_control():
    rec = Recorder(messages_ok())
    client, _ = make(rec)
    call(client, "anthropic:claude-opus-4.5", prefix="")
    assert rec.body()["messages"][0]["content"] == [{"type": "text", "text": "PROMPT"}]


def test_anthropic_max_tokens_reads_as_length():
    rec = Recorder(messages_ok('{"verdict": "pa', stop="max_tokens"))
    client, _ = make(rec)
    assert call(client, "anthropic:claude-opus-4.5").finish_reason == "length"


def test_anthropic_with_base_and_no_key_sends_no_key():
    rec = Recorder(messages_ok())
    client, _ = make(rec, keys=ProviderKeys())
    call(client, "anthropic@http://127.0.0.1:9000:careful")
    req = rec.requests[0]
    assert str(req.url) == "http://127.0.0.1:9000/v1/messages"
    assert "x-api-key" not in req.headers


def test_cache_ttl_is_passed_through():
    rec = Recorder(messages_ok())
    client, _ = make(rec, cache_ttl="1h")
    call(client, "anthropic:claude-opus-4.5")
    block = rec.body()["messages"][0]["content"][0]
    assert block["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


# --- credentials ---------------------------------------------------------------------------


def test_missing_key_fails_without_a_request():
    rec = Recorder(chat_ok())
    client, _ = make(rec, keys=ProviderKeys())
    with pytest.raises(ProviderError) as info:
        call(client, OPENROUTER_OTHER)
    assert info.value.failure.kind == "auth"
    assert "OPENROUTER_API_KEY" in info.value.failure.message
    assert info.value.failure.attempts == 0
    assert rec.requests == []


def test_missing_credentials_names_env_vars_once():
    refs = [
        "openrouter:a/b",
        "openrouter:c/d",
        "anthropic:claude-opus-4.5",
        "openai:gpt-5.1",
        "openai-compat@http://127.0.0.1:8000/v1:m",
        "anthropic@http://127.0.0.1:9000:careful",
        "openai@http://localhost:4000/v1:proxy",
    ]
    assert missing_credentials(refs, ProviderKeys()) == [
        "OPENROUTER_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
    ]
    assert missing_credentials([parse_model_ref(r) for r in refs], KEYS) == []


def test_keys_from_settings_and_repr_hides_them():
    settings = CouncilSettings(OPENROUTER_API_KEY="sk-or-secret", anthropic_api_key="sk-ant-secret")
    keys = ProviderKeys.from_settings(settings)
    assert keys.openrouter == "sk-or-secret"
    assert keys.anthropic == "sk-ant-secret"
    assert keys.openai is None and keys.openai_compat is None
    assert "secret" not in repr(keys)


# --- error classes -------------------------------------------------------------------------


def test_401_is_auth_and_not_retried():
    rec = Recorder(
        error(
            401,
            {
                "error": {
                    "message": "Invalid API key",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        )
    )
    client, clock = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client, "openai:gpt-5.1")
    f = info.value.failure
    assert (f.kind, f.status, f.attempts) == ("auth", 401, 1)
    assert f.type == "invalid_request_error/invalid_api_key"
    assert f.message == "Invalid API key"
    assert len(rec.requests) == 1 and clock.sleeps == []


def test_402_openrouter_is_billing_and_says_so():
    body = {
        "error": {
            "code": 402,
            "message": "Insufficient credits. Add more using https://openrouter.ai/settings/credits",
        }
    }
    rec = Recorder(error(402, body))
    client, clock = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client)
    f = info.value.failure
    assert f.kind == "billing" and f.status == 402
    assert f.message.startswith("billing: ")
    assert "credits" in f.message
    assert len(rec.requests) == 1 and clock.sleeps == []


def test_openai_insufficient_quota_429_is_billing_not_a_rate_limit():
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }
    }
    rec = Recorder(error(429, body))
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client, "openai:gpt-5.1")
    assert info.value.failure.kind == "billing"
    assert len(rec.requests) == 1


def test_anthropic_low_credit_400_is_billing():
    body = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Your credit balance is too low to access the Anthropic API.",
        },
    }
    rec = Recorder(error(400, body))
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client, "anthropic:claude-opus-4.5")
    assert info.value.failure.kind == "billing"
    assert "billing" in info.value.failure.message


def test_ordinary_rate_limit_mentioning_billing_page_stays_rate_limit():
    f = failure_from_response(
        429,
        json.dumps(
            {
                "error": {
                    "message": "Rate limit reached. Add a payment method at "
                    "https://platform.openai.com/account/billing to raise it.",
                    "type": "requests",
                }
            }
        ),
    )
    assert f.kind == "rate_limit"


def test_429_honours_retry_after_seconds():
    rec = Recorder(error(429, {"error": {"message": "slow down"}}, {"retry-after": "3"}), chat_ok())
    client, clock = make(rec)
    done = call(client)
    assert done.attempts == 2
    assert clock.sleeps == [3.0]
    assert [r.headers[HEADER_ATTEMPT] for r in rec.requests] == ["1", "2"]


def test_retry_after_ms_wins_over_retry_after():
    headers = {"retry-after-ms": "1500", "retry-after": "10"}
    rec = Recorder(error(429, {"error": {"message": "slow down"}}, headers), chat_ok())
    client, clock = make(rec)
    call(client)
    assert clock.sleeps == [1.5]


def test_retry_after_http_date():
    clock = FakeClock(now=time.time())
    when = formatdate(clock.now + 5, usegmt=True)
    rec = Recorder(error(503, "busy", {"retry-after": when}), chat_ok())
    client, clock = make(rec, clock=clock)
    call(client)
    assert len(clock.sleeps) == 1 and 3.5 <= clock.sleeps[0] <= 5.0


def test_x_should_retry_false_forbids_a_retry():
    rec = Recorder(error(500, {"error": {"message": "boom"}}, {"x-should-retry": "false"}))
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client)
    assert info.value.failure.kind == "server"
    assert len(rec.requests) == 1


def test_x_should_retry_true_forces_a_retry():
    rec = Recorder(error(422, {"error": {"message": "odd"}}, {"x-should-retry": "true"}), chat_ok())
    client, _ = make(rec)
    assert call(client).attempts == 2


def test_x_should_retry_true_cannot_retry_a_400():
    rec = Recorder(error(400, {"error": {"message": "bad"}}, {"x-should-retry": "true"}), chat_ok())
    client, _ = make(rec)
    with pytest.raises(ProviderError):
        call(client)
    assert len(rec.requests) == 1


def test_500_then_success_backs_off():
    rec = Recorder(error(500, {"error": {"message": "internal"}}), chat_ok())
    client, clock = make(rec)
    done = call(client)
    assert done.attempts == 2
    assert len(clock.sleeps) == 1 and 0.25 <= clock.sleeps[0] <= 0.5


def test_backoff_grows_and_is_capped():
    rec = Recorder(error(502, "bad gateway"))
    client, clock = make(rec, max_attempts=7)
    with pytest.raises(ProviderError) as info:
        call(client)
    assert info.value.failure.attempts == 7
    assert info.value.failure.status == 502
    # rand() = 0.5 -> 75% of the ceiling: 0.5, 1, 2, 4, 8, 8 s ceilings.
    assert clock.sleeps == [0.375, 0.75, 1.5, 3.0, 6.0, 6.0]


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404])
def test_client_errors_are_never_retried(status):
    rec = Recorder(error(status, {"error": {"message": "no"}}), chat_ok())
    client, clock = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client, schema=None)
    assert info.value.failure.status == status
    assert len(rec.requests) == 1 and clock.sleeps == []


def test_404_is_not_found_and_400_bad_request():
    assert failure_from_response(404, '{"error": {"message": "no such model"}}').kind == (
        "not_found"
    )
    assert failure_from_response(400, '{"error": {"message": "bad"}}').kind == "bad_request"


def test_error_in_a_200_body_is_classified_by_its_code_and_retried():
    body = {"error": {"code": 502, "message": "Upstream error from provider"}}
    rec = Recorder(httpx.Response(200, json=body), chat_ok())
    client, _ = make(rec)
    done = call(client)
    assert done.attempts == 2


def test_error_in_a_200_body_keeps_code_and_message():
    body = {"error": {"code": 401, "message": "User not found."}}
    rec = Recorder(httpx.Response(200, json=body))
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client)
    f = info.value.failure
    assert (f.kind, f.status, f.message, f.attempts) == ("auth", 401, "User not found.", 1)


def test_choice_level_error_is_a_failure():
    body = {"choices": [{"finish_reason": "error", "error": {"code": 429, "message": "upstream"}}]}
    rec = Recorder(httpx.Response(200, json=body), chat_ok())
    client, _ = make(rec)
    assert call(client).attempts == 2


def test_non_json_200_is_malformed_and_not_retried():
    rec = Recorder(httpx.Response(200, text="<html>gateway</html>"), chat_ok())
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client)
    assert info.value.failure.kind == "malformed"
    assert len(rec.requests) == 1


def test_200_without_choices_is_malformed():
    rec = Recorder(httpx.Response(200, json={"id": "x"}))
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client)
    assert info.value.failure.kind == "malformed"


def test_connection_refused_is_retried_then_reported():
    rec = Recorder(httpx.ConnectError("[Errno 111] Connection refused"))
    client, clock = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client)
    f = info.value.failure
    assert f.kind == "connection" and f.attempts == 4
    assert "refused" in f.message
    assert len(rec.requests) == 4 and len(clock.sleeps) == 3


def test_real_connection_refused_is_connection():
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on this port now
    client = HttpProviderClient(ProviderKeys(), max_attempts=1, http=pooled.new_http_client())
    with pytest.raises(ProviderError) as info:
        call(client, f"openai-compat@http://127.0.0.1:{port}/v1:m", timeout_s=2.0)
    assert info.value.failure.kind == "connection"


@pytest.mark.parametrize("exc", [httpx.ReadTimeout("read"), httpx.ConnectTimeout("connect")])
def test_timeouts_are_timeout_and_retried(exc):
    rec = Recorder(exc, chat_ok())
    client, _ = make(rec)
    assert call(client).attempts == 2
    rec = Recorder(exc)
    client, _ = make(rec, max_attempts=2)
    with pytest.raises(ProviderError) as info:
        call(client)
    assert info.value.failure.kind == "timeout"
    assert info.value.failure.is_timeout


def test_a_trickling_response_is_held_to_the_attempt_timeout():
    def trickle() -> Iterator[bytes]:
        for _ in range(20):
            time.sleep(0.05)
            yield b" "

    rec = Recorder(lambda request: httpx.Response(200, content=trickle()))
    client, _ = make(rec, max_attempts=1)
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        call(client, timeout_s=0.2)
    assert info.value.failure.kind == "timeout"
    assert time.monotonic() - started < 0.6


# --- deadlines -----------------------------------------------------------------------------


def test_no_attempt_starts_past_the_deadline():
    rec = Recorder(error(500, "boom"))
    clock = FakeClock()
    client, clock = make(rec, clock=clock, max_attempts=50)
    deadline = clock.now + 3.0
    with pytest.raises(ProviderError) as info:
        call(client, deadline_at=deadline)
    assert info.value.failure.kind == "server"
    assert info.value.failure.attempts == len(rec.requests) >= 2
    assert all(t <= deadline - 0.2 for t in rec.times)
    assert clock.now <= deadline


def test_attempt_timeout_is_capped_by_the_deadline():
    rec = Recorder(chat_ok())
    clock = FakeClock()
    client, clock = make(rec, clock=clock)
    call(client, timeout_s=60.0, deadline_at=clock.now + 7.5)
    timeout = rec.requests[0].extensions["timeout"]
    assert timeout["read"] == pytest.approx(7.5)
    assert timeout["connect"] <= 7.5


def test_deadline_already_passed_makes_no_call():
    rec = Recorder(chat_ok())
    clock = FakeClock()
    client, clock = make(rec, clock=clock)
    with pytest.raises(ProviderError) as info:
        call(client, deadline_at=clock.now + 0.1)
    assert info.value.failure.kind == "timeout"
    assert info.value.failure.attempts == 0
    assert rec.requests == []


def test_retry_after_beyond_the_deadline_gives_up_at_once():
    rec = Recorder(error(429, {"error": {"message": "later"}}, {"retry-after": "30"}), chat_ok())
    clock = FakeClock()
    client, clock = make(rec, clock=clock)
    with pytest.raises(ProviderError) as info:
        call(client, deadline_at=clock.now + 10.0)
    assert info.value.failure.kind == "rate_limit"
    assert info.value.failure.attempts == 1
    assert clock.sleeps == []


# --- json_schema fallback ------------------------------------------------------------------


def test_json_schema_rejection_retries_once_without_response_format():
    rejection = error(
        400, {"error": {"message": "response_format type json_schema is not supported"}}
    )
    rec = Recorder(rejection, chat_ok(), chat_ok())
    client, clock = make(rec)
    done = call(client, "openai-compat@http://127.0.0.1:8080/v1:local")
    assert done.attempts == 2
    assert "response_format" in json.loads(rec.requests[0].content)
    assert "response_format" not in json.loads(rec.requests[1].content)
    assert clock.sleeps == []
    # The server is remembered: the next call goes without response_format at once.
    call(client, "openai-compat@http://127.0.0.1:8080/v1:local")
    assert len(rec.requests) == 3
    assert "response_format" not in json.loads(rec.requests[2].content)


def test_json_schema_fallback_happens_only_once():
    rejection = error(400, {"error": {"message": "unknown field response_format"}})
    rec = Recorder(rejection)
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client, "openai-compat@http://127.0.0.1:8080/v1:local")
    assert info.value.failure.kind == "bad_request"
    assert info.value.failure.attempts == 2


def test_other_400_is_not_a_schema_rejection():
    rec = Recorder(error(400, {"error": {"message": "context length exceeded"}}), chat_ok())
    client, _ = make(rec)
    with pytest.raises(ProviderError):
        call(client)
    assert len(rec.requests) == 1


# --- messages never leak -------------------------------------------------------------------


def test_error_messages_redact_keys_and_never_quote_the_prompt():
    rec = Recorder(error(401, {"error": {"message": "Bad key sk-test-openai-key-123456 provided"}}))
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client, "openai:gpt-5.1")
    assert "sk-test-openai-key-123456" not in info.value.failure.message
    assert "redacted" in info.value.failure.message

    prompt = "def handler(request): return eval(request.args['expr'])  # review me please"
    rec = Recorder(error(400, {"error": {"message": f"Invalid input near: {prompt[:60]}"}}))
    client, _ = make(rec)
    with pytest.raises(ProviderError) as info:
        call(client, "openai:gpt-5.1", prompt=prompt, schema=None)
    assert "eval" not in info.value.failure.message
    assert "quoted the request" in info.value.failure.message


def test_long_messages_are_trimmed():
    assert len(scrub_message("x" * 5000)) <= 500


# --- helpers -------------------------------------------------------------------------------


def test_retry_after_parsing():
    assert retry_after_s({"Retry-After": "2"}) == 2.0
    assert retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert retry_after_s({"retry-after-ms": "junk", "retry-after": "1.5"}) == 1.5
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({"retry-after": "-3"}) is None
    assert retry_after_s({}) is None
    now = 1_700_000_000.0
    assert retry_after_s({"retry-after": formatdate(now + 4, usegmt=True)}, now=now) == 4.0
    assert retry_after_s({"retry-after": formatdate(now - 4, usegmt=True)}, now=now) == 0.0


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (408, {}, True),
        (409, {}, True),
        (429, {}, True),
        (500, {}, True),
        (529, {}, True),
        (500, {"x-should-retry": "false"}, False),
        (422, {"X-Should-Retry": "true"}, True),
        (422, {}, False),
        (400, {"x-should-retry": "true"}, False),
        (401, {}, False),
        (402, {}, False),
        (403, {}, False),
        (404, {}, False),
    ],
)
def test_is_retryable(status, headers, expected):
    assert is_retryable(status, headers) is expected


# --- the pooled client ---------------------------------------------------------------------


def test_one_pooled_client_per_process_and_a_new_one_after_fork():
    pooled.close_http_client()
    first = pooled.get_http_client()
    assert pooled.get_http_client() is first
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's pool
        try:
            child = pooled.get_http_client()
            ok = child is not first and pooled.get_http_client() is child
            os.write(write_fd, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    assert os.read(read_fd, 1) == b"1"
    os.close(read_fd)
    assert pooled.get_http_client() is first
    pooled.close_http_client()
    assert pooled.get_http_client() is not first
    pooled.close_http_client()


def test_pooled_client_limits():
    client = pooled.new_http_client()
    try:
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert pool._max_connections == pooled.MAX_CONNECTIONS
    finally:
        client.close()
