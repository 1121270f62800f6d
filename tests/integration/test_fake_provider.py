"""The offline fake provider over real HTTP: both API shapes, every behaviour, admin API."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ops.fake_provider.detectors import load_json_object
from ops.fake_provider.server import FakeProvider
from shared import prompts
from shared.models import Stage
from shared.providers.base import HEADER_STAGE, HEADER_VERIFICATION, CallMeta, ProviderError
from shared.providers.client import HttpProviderClient, ProviderKeys
from shared.providers.refs import parse_model_ref
from shared.subject import Subject, SubjectFile

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

VULNERABLE = """\
import os


def find_user(cur, name):
    cur.execute(f"SELECT * FROM users WHERE name = '{name}'")
    return cur.fetchone()
"""
CLEAN = """\
def find_user(cur, user_id):
    cur.execute("SELECT * FROM users WHERE id = %s", (user_id,))
    return cur.fetchone()
"""


def prefix_for(content: str, path: str = "app/db.py") -> str:
    subject = Subject(
        snapshot_requested="HEAD",
        snapshot_resolved="0" * 40,
        files=(SubjectFile(path=path, content=content),),
    )
    return prompts.stable_prefix(prompts.render_subject(subject), ())


PREFIX = prefix_for(VULNERABLE)
STAGE1 = PREFIX + prompts.stage1_prompt()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProvider) -> Iterator[FakeProvider]:
    server.reset()
    yield server
    server.reset()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


def council(verification: str | None = "v1", stage: str | None = "stage1") -> dict[str, str]:
    h = {}
    if verification is not None:
        h[HEADER_VERIFICATION] = verification
    if stage is not None:
        h[HEADER_STAGE] = stage
    return h


def openai_call(
    http: httpx.Client,
    fake: FakeProvider,
    model: str,
    prompt: str | list[dict[str, Any]] = STAGE1,
    *,
    headers: dict[str, str] | None = None,
    system: str = prompts.SYSTEM_PROMPT,
    **extra: Any,
) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        **extra,
    }
    return http.post(
        f"{fake.openai_base}/chat/completions",
        json=body,
        headers=council() if headers is None else headers,
    )


def anthropic_call(
    http: httpx.Client,
    fake: FakeProvider,
    model: str,
    prompt: str | list[dict[str, Any]] = STAGE1,
    *,
    headers: dict[str, str] | None = None,
    system: str | list[dict[str, Any]] = prompts.SYSTEM_PROMPT,
    max_tokens: int = 4096,
) -> httpx.Response:
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "system": system,
        "messages": [{"role": "user", "content": prompt}],
    }
    return http.post(
        f"{fake.anthropic_base}/v1/messages",
        json=body,
        headers={"anthropic-version": "2023-06-01", **(council() if headers is None else headers)},
    )


def openai_text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def anthropic_text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["content"][0]["text"])


def calls_of(fake: FakeProvider) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {
        (c["verification"], c["stage"], c["model"]): (c["calls"], c["completed"])
        for c in fake.calls()
    }


# --- the two API shapes --------------------------------------------------------------------


def test_openai_shape_careful_stage1(fake: FakeProvider, http: httpx.Client) -> None:
    r = openai_call(http, fake, "careful-a", response_format={"type": "json_object"})
    data = r.json()
    assert r.status_code == 200
    assert data["object"] == "chat.completion" and data["model"] == "careful-a"
    assert data["id"]
    choice = data["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    answer = json.loads(choice["message"]["content"])
    assert answer["verdict"] == "fail" and answer["confidence"] == 0.9
    assert [(f["severity"], f["location"]) for f in answer["findings"]] == [
        ("critical", "app/db.py:5")
    ]
    usage = data["usage"]
    full = prompts.SYSTEM_PROMPT + "\n" + STAGE1
    assert usage["prompt_tokens"] == len(full) // 4
    assert usage["completion_tokens"] == len(choice["message"]["content"]) // 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert calls_of(fake) == {("v1", "stage1", "careful-a"): (1, 1)}


def test_anthropic_shape_with_blocks_and_cache_control(
    fake: FakeProvider, http: httpx.Client
) -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": PREFIX, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": prompts.stage1_prompt()},
    ]
    system = [{"type": "text", "text": prompts.SYSTEM_PROMPT}]
    r = anthropic_call(http, fake, "careful-b", blocks, system=system)
    data = r.json()
    assert r.status_code == 200
    assert (data["type"], data["role"], data["model"]) == ("message", "assistant", "careful-b")
    assert data["stop_reason"] == "end_turn"
    assert data["content"][0]["type"] == "text"
    assert json.loads(data["content"][0]["text"])["verdict"] == "fail"
    assert set(data["usage"]) >= {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }
    [rec] = fake.prompts()
    assert rec["api"] == "anthropic" and rec["cache_control"] is True
    assert rec["system"] == prompts.SYSTEM_PROMPT
    assert rec["prompt"] == STAGE1  # the blocks joined: prefix + tail


def test_openai_content_parts_are_joined(fake: FakeProvider, http: httpx.Client) -> None:
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": PREFIX, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": prompts.stage1_prompt()},
    ]
    assert json.loads(openai_text(openai_call(http, fake, "careful", parts)))["verdict"] == "fail"
    assert fake.prompts()[0]["prompt"] == STAGE1


def test_prompt_recording_and_counts_per_verification_stage_model(
    fake: FakeProvider, http: httpx.Client
) -> None:
    openai_call(http, fake, "careful-a", headers=council("v1", "stage1"))
    openai_call(http, fake, "careful-a", headers=council("v1", "stage1"))
    openai_call(http, fake, "careful-b", headers=council("v2", "stage1"))
    anthropic_call(http, fake, "careful-a", headers=council("v1", "chairman"))
    assert calls_of(fake) == {
        ("v1", "stage1", "careful-a"): (2, 2),
        ("v1", "chairman", "careful-a"): (1, 1),
        ("v2", "stage1", "careful-b"): (1, 1),
    }
    recs = fake.prompts()
    assert len(recs) == 4
    assert recs[0] == {
        "verification": "v1",
        "stage": "stage1",
        "model": "careful-a",
        "api": "openai",
        "system": prompts.SYSTEM_PROMPT,
        "prompt": STAGE1,
        "headers": {HEADER_VERIFICATION: "v1", HEADER_STAGE: "stage1"},
        "cache_control": False,
        "attempt": None,
    }
    assert [p["api"] for p in recs] == ["openai", "openai", "openai", "anthropic"]
    assert len(fake.prompts(verification="v1")) == 3
    assert len(fake.prompts(stage="chairman", model="careful-a")) == 1
    assert fake.calls(model="careful-b") == [
        {"verification": "v2", "stage": "stage1", "model": "careful-b", "calls": 1, "completed": 1}
    ]


def test_stage_falls_back_to_the_prompt_marker(fake: FakeProvider, http: httpx.Client) -> None:
    stage2 = PREFIX + prompts.stage2_prompt([("A", "{}")])
    r = openai_call(http, fake, "careful", stage2, headers={})
    assert set(json.loads(openai_text(r))) == {"ranking", "scores", "findings"}
    openai_call(http, fake, "careful", "no marker at all", headers={})
    assert calls_of(fake) == {
        ("unknown", "stage2", "careful"): (1, 1),
        ("unknown", "unknown", "careful"): (1, 1),
    }
    assert fake.prompts()[0]["headers"] == {}


def test_stage2_and_chairman_answers(fake: FakeProvider, http: httpx.Client) -> None:
    careful = openai_text(openai_call(http, fake, "careful-a"))
    lenient = openai_text(openai_call(http, fake, "lenient-1"))
    assert json.loads(lenient) == {
        "verdict": "pass",
        "confidence": 0.8,
        "summary": "Looks good to me.",
        "findings": [],
    }
    answers = [("A", lenient), ("B", careful)]
    r = openai_call(
        http,
        fake,
        "careful-c",
        PREFIX + prompts.stage2_prompt(answers),
        headers=council("v1", "stage2"),
    )
    review = json.loads(openai_text(r))
    assert review["ranking"] == ["Response B", "Response A"]
    assert review["scores"]["Response B"]["accuracy"] > review["scores"]["Response A"]["accuracy"]
    r = anthropic_call(
        http,
        fake,
        "lenient-2",
        PREFIX + prompts.stage2_prompt(answers),
        headers=council("v1", "stage2"),
    )
    assert json.loads(anthropic_text(r))["ranking"] == ["Response A", "Response B"]
    chair_prompt = PREFIX + prompts.chairman_prompt(answers, ["B", "A"], 1.0)
    r = openai_call(http, fake, "careful-chair", chair_prompt, headers=council("v1", "chairman"))
    chair = json.loads(openai_text(r))
    assert chair["verdict"] == "fail" and chair["confidence"] == 0.9
    assert [f["location"] for f in chair["findings"]] == ["app/db.py:5"]
    assert set(chair) == {"verdict", "confidence", "rationale", "findings", "rubric_scores"}


# --- behaviours ----------------------------------------------------------------------------


def test_unsure_contradict_and_prose(fake: FakeProvider, http: httpx.Client) -> None:
    unsure = json.loads(openai_text(openai_call(http, fake, "unsure-1")))
    assert unsure["confidence"] == 0.3 and unsure["verdict"] == "fail"
    clean_chair = prefix_for(CLEAN) + prompts.chairman_prompt([], [], None)
    r = openai_call(http, fake, "contradict", clean_chair, headers=council("v", "chairman"))
    contra = json.loads(openai_text(r))
    assert contra["verdict"] == "fail"
    assert not [f for f in contra["findings"] if f["severity"] == "critical"]
    as_member = json.loads(openai_text(openai_call(http, fake, "contradict")))
    assert as_member["verdict"] == "fail" and as_member["findings"]  # careful outside chair
    prose = openai_text(openai_call(http, fake, "prose-1"))
    assert not prose.lstrip().startswith("{") and "```json" in prose
    with pytest.raises(ValueError):
        json.loads(prose)
    assert load_json_object(prose) == unsure | {"confidence": 0.9}


def test_clean_code_passes(fake: FakeProvider, http: httpx.Client) -> None:
    clean = prefix_for(CLEAN) + prompts.stage1_prompt()
    for r in (
        openai_call(http, fake, "careful", clean),
        anthropic_call(http, fake, "careful", clean),
    ):
        body = r.json()
        text = (
            body["choices"][0]["message"]["content"]
            if "choices" in body
            else (body["content"][0]["text"])
        )
        assert json.loads(text)["verdict"] == "pass"
        assert json.loads(text)["findings"] == []


def test_slow_answers_after_its_latency(fake: FakeProvider, http: httpx.Client) -> None:
    t = time.monotonic()
    assert json.loads(openai_text(openai_call(http, fake, "slow-200")))["verdict"] == "fail"
    assert time.monotonic() - t >= 0.2


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_flaky429_first_call_per_key_then_careful(
    fake: FakeProvider, http: httpx.Client, shape: str
) -> None:
    call = openai_call if shape == "openai" else anthropic_call
    first = call(http, fake, "flaky429")
    assert first.status_code == 429
    assert first.headers["retry-after"] == "1" and first.headers["retry-after-ms"] == "50"
    if shape == "openai":
        assert first.json()["error"]["type"] and first.json()["error"]["message"]
    else:
        assert first.json() == {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": first.json()["error"]["message"]},
        }
    assert call(http, fake, "flaky429").status_code == 200
    # another (verification, stage, model) key gets its own first 429
    assert call(http, fake, "flaky429", headers=council("v1", "stage2")).status_code == 429
    assert call(http, fake, "flaky429", headers=council("v1", "stage2")).status_code == 200
    assert calls_of(fake)[("v1", "stage1", "flaky429")] == (2, 1)
    for _ in range(3):
        assert call(http, fake, "flaky429always").status_code == 429


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_flaky500_first_call_then_careful(
    fake: FakeProvider, http: httpx.Client, shape: str
) -> None:
    call = openai_call if shape == "openai" else anthropic_call
    r = call(http, fake, "flaky500")
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == ("server_error" if shape == "openai" else "api_error")
    assert call(http, fake, "flaky500").status_code == 200
    assert call(http, fake, "flaky500always").status_code == 500
    assert call(http, fake, "flaky500always").status_code == 500


def test_malformed_and_truncated(fake: FakeProvider, http: httpx.Client) -> None:
    text = openai_text(openai_call(http, fake, "malformed"))
    assert load_json_object(text) is None
    r = openai_call(http, fake, "truncated")
    assert r.json()["choices"][0]["finish_reason"] == "length"
    cut = r.json()["choices"][0]["message"]["content"]
    full = openai_text(openai_call(http, fake, "careful"))
    assert full.startswith(cut) and 0 < len(cut) < len(full)
    with pytest.raises(ValueError):
        json.loads(cut)
    r = anthropic_call(http, fake, "truncated")
    assert r.json()["stop_reason"] == "max_tokens"
    # a small max_tokens cuts a normal answer as well
    r = anthropic_call(http, fake, "careful", max_tokens=10)
    assert r.json()["stop_reason"] == "max_tokens"
    assert len(r.json()["content"][0]["text"]) == 40
    r = openai_call(http, fake, "careful", max_tokens=10)
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_auth_billing_and_error200_shapes(fake: FakeProvider, http: httpx.Client) -> None:
    r = openai_call(http, fake, "auth401")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert set(r.json()["error"]) == {"message", "type", "code"}
    r = anthropic_call(http, fake, "auth401")
    assert r.status_code == 401
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"

    r = openai_call(http, fake, "billing402")
    assert r.status_code == 402
    body = r.json()
    assert body["error"]["code"] == 402 and body["error"]["metadata"] == {}
    assert body["error"]["message"].startswith("Insufficient credits. Add more using https://")
    r = anthropic_call(http, fake, "billing402")
    assert r.status_code == 402
    assert r.json() == {
        "type": "error",
        "error": {"type": "billing_error", "message": "Your credit balance is too low"},
    }

    r = openai_call(http, fake, "error200")
    assert r.status_code == 200
    assert r.json() == {"error": {"code": 502, "message": "upstream error"}}
    assert calls_of(fake)[("v1", "stage1", "error200")] == (1, 0)
    assert calls_of(fake)[("v1", "stage1", "billing402")] == (2, 0)


def test_unknown_model_and_bad_requests(fake: FakeProvider, http: httpx.Client) -> None:
    r = openai_call(http, fake, "gpt-5")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = anthropic_call(http, fake, "claude-x")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = http.post(f"{fake.openai_base}/chat/completions", content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = http.post(
        f"{fake.anthropic_base}/v1/messages",
        json={"model": "careful", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 400
    assert r.json()["type"] == "error" and "max_tokens" in r.json()["error"]["message"]
    r = http.post(f"{fake.openai_base}/chat/completions", json={"model": "careful"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = openai_call(http, fake, "careful", response_format={"type": "xml"})
    assert r.status_code == 400
    assert http.get(f"{fake.openai_base}/chat/completions").status_code == 405
    assert http.get(f"{fake.url}/nowhere").status_code == 404


def test_hang_is_released_when_the_server_stops(http: httpx.Client) -> None:
    fake = FakeProvider().start()
    outcome: list[BaseException | httpx.Response] = []

    def call() -> None:
        try:
            outcome.append(openai_call(http, fake, "hang"))
        except Exception as exc:  # the connection is closed without an answer
            outcome.append(exc)

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 5
    while not fake.calls() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.calls()[0]["calls"] == 1 and fake.calls()[0]["completed"] == 0
    started = time.monotonic()
    fake.stop()
    t.join(timeout=5)
    assert not t.is_alive()
    assert time.monotonic() - started < 2
    assert isinstance(outcome[0], httpx.TransportError)
    with pytest.raises(httpx.TransportError):  # stopped means stopped, pooled or not
        openai_call(http, fake, "careful")
    fake.stop()  # idempotent


def test_hang_times_out_on_the_client(fake: FakeProvider) -> None:
    with httpx.Client(timeout=0.2) as client, pytest.raises(httpx.ReadTimeout):
        openai_call(client, fake, "hang")


# --- admin API and configuration -----------------------------------------------------------


def test_admin_endpoints_over_http(fake: FakeProvider, http: httpx.Client) -> None:
    openai_call(http, fake, "careful-a")
    assert http.get(f"{fake.url}/admin/health").json()["status"] == "ok"
    assert http.get(f"{fake.url}/admin/calls").json() == {"calls": fake.calls()}
    [rec] = http.get(f"{fake.url}/admin/prompts").json()["prompts"]
    assert rec["prompt"] == STAGE1 and rec["model"] == "careful-a"
    cfg = {
        "latency_ms": 5,
        "rps_limit": 100,
        "faults": {"careful-a": {"behaviour": "http500", "stages": ["stage2"], "times": 1}},
    }
    r = http.post(f"{fake.url}/admin/config", json=cfg)
    assert r.status_code == 200
    assert r.json() == {
        "latency_ms": 5,
        "rps_limit": 100.0,
        "faults": {"careful-a": {"behaviour": "http500", "stages": ["stage2"], "times": 1}},
    }
    assert http.get(f"{fake.url}/admin/config").json() == r.json()
    bad = http.post(f"{fake.url}/admin/config", json={"faults": {"x": {"behaviour": "nope"}}})
    assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
    assert http.post(f"{fake.url}/admin/config", json={"latency_ms": -1}).status_code == 400
    assert http.post(f"{fake.url}/admin/reset").json() == {"ok": True}
    assert fake.calls() == [] and fake.prompts() == []
    assert fake.config() == {"latency_ms": 0, "rps_limit": None, "faults": {}}


def test_faults_limited_to_stages_and_times(fake: FakeProvider, http: httpx.Client) -> None:
    fake.configure(
        faults={
            "careful-a": {"behaviour": "http500", "stages": ["stage2"], "times": 2},
            "careful-b": {"behaviour": "billing402", "stages": None, "times": None},
        }
    )
    s2 = council("v1", "stage2")
    assert openai_call(http, fake, "careful-a").status_code == 200  # stage1 untouched
    assert openai_call(http, fake, "careful-a", headers=s2).status_code == 500
    assert anthropic_call(http, fake, "careful-a", headers=s2).status_code == 500
    assert openai_call(http, fake, "careful-a", headers=s2).status_code == 200  # times used up
    assert fake.config()["faults"]["careful-a"]["times"] == 0
    for stage in ("stage1", "stage2", "chairman"):
        r = openai_call(http, fake, "careful-b", headers=council("v1", stage))
        assert r.status_code == 402
    # faults use the behaviour names too: hang-free ones only here
    fake.configure(faults={"*": {"behaviour": "http429", "times": 1}})
    r = openai_call(http, fake, "lenient")
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert openai_call(http, fake, "lenient").status_code == 200
    fake.configure(faults={"lenient": {"behaviour": "truncated", "stages": ["stage1"]}})
    r = openai_call(http, fake, "lenient")
    assert r.json()["choices"][0]["finish_reason"] == "length"
    with pytest.raises(ValueError):
        fake.configure(faults={"x": {"behaviour": "careful", "stages": "stage1"}})
    with pytest.raises(ValueError):
        fake.configure(bogus=1)


def test_global_latency(fake: FakeProvider, http: httpx.Client) -> None:
    fake.configure(latency_ms=150)
    t = time.monotonic()
    assert openai_call(http, fake, "careful").status_code == 200
    assert time.monotonic() - t >= 0.15
    fake.configure(latency_ms=0)
    t = time.monotonic()
    assert openai_call(http, fake, "careful").status_code == 200
    assert time.monotonic() - t < 0.15


def test_rps_limit_sliding_window(fake: FakeProvider, http: httpx.Client) -> None:
    fake.configure(rps_limit=5)
    statuses = [openai_call(http, fake, "lenient").status_code for _ in range(8)]
    assert statuses[:5] == [200] * 5 and statuses[5:] == [429] * 3
    r = openai_call(http, fake, "lenient")
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    wait_ms = int(r.headers["retry-after-ms"])
    assert 0 < wait_ms <= 1000
    time.sleep(wait_ms / 1000 + 0.02)
    assert openai_call(http, fake, "lenient").status_code == 200
    assert calls_of(fake)[("v1", "stage1", "lenient")] == (10, 6)
    fake.configure(rps_limit=None)
    assert all(openai_call(http, fake, "lenient").status_code == 200 for _ in range(10))


def test_prompt_caching_numbers(fake: FakeProvider, http: httpx.Client) -> None:
    system = "S"
    big = prefix_for(VULNERABLE + "".join(f"X{i} = {i}\n" for i in range(100)))
    tail1, tail2 = prompts.stage1_prompt(), prompts.stage2_prompt([("A", "{}")])
    assert len(big) >= 1024
    a, b = system + "\n" + big + tail1, system + "\n" + big + tail2
    lcp = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )

    r1 = openai_call(http, fake, "careful-o", big + tail1, system=system)
    assert r1.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    r2 = openai_call(http, fake, "careful-o", big + tail2, system=system)
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == lcp // 4
    # another model has its own cache; short prompts never cache
    r3 = openai_call(http, fake, "careful-p", big + tail2, system=system)
    assert r3.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    openai_call(http, fake, "careful-o", "short", system=system)
    r4 = openai_call(http, fake, "careful-o", "short", system=system)
    assert r4.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    def blocks(tail: str) -> list[dict[str, Any]]:
        return [
            {"type": "text", "text": big, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": tail},
        ]

    a1 = anthropic_call(http, fake, "careful-q", blocks(tail1), system=system).json()["usage"]
    cacheable = len(system) + 1 + len(big)
    total1 = (len(system) + 1 + len(big + tail1)) // 4
    assert a1["cache_read_input_tokens"] == 0
    assert a1["cache_creation_input_tokens"] == cacheable // 4
    assert a1["input_tokens"] == total1 - cacheable // 4
    a2 = anthropic_call(http, fake, "careful-q", blocks(tail2), system=system).json()["usage"]
    total2 = (len(system) + 1 + len(big + tail2)) // 4
    assert a2["cache_read_input_tokens"] == lcp // 4
    assert lcp > cacheable and a2["cache_creation_input_tokens"] == 0
    assert a2["input_tokens"] == total2 - lcp // 4


def test_many_concurrent_requests(fake: FakeProvider) -> None:
    results: list[int] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        with httpx.Client(timeout=10) as client:
            r = openai_call(client, fake, f"careful-{i % 4}", headers=council(f"v{i}", "stage1"))
        with lock:
            results.append(r.status_code)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert results == [200] * 60
    calls = fake.calls()
    assert len(calls) == 60 and all(c["calls"] == c["completed"] == 1 for c in calls)


# --- with the project's own provider client ------------------------------------------------


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_project_client_retries_flaky_and_reports_billing(fake: FakeProvider, shape: str) -> None:
    client = HttpProviderClient(ProviderKeys(), sleep=lambda _s: None)

    def complete(model: str) -> Any:
        return client.complete(
            parse_model_ref(fake.model_id(model, shape)),
            system=prompts.SYSTEM_PROMPT,
            cacheable_prefix=PREFIX,
            prompt=prompts.stage1_prompt(),
            schema=prompts.STAGE1_SCHEMA,
            schema_name="stage1",
            timeout_s=5,
            deadline_at=None,
            meta=CallMeta("v-client", Stage.STAGE1),
        )

    done = complete("flaky429")
    assert done.attempts == 2 and json.loads(done.text)["verdict"] == "fail"
    assert [p["attempt"] for p in fake.prompts(model="flaky429")] == [1, 2]
    assert calls_of(fake)[("v-client", "stage1", "flaky429")] == (2, 1)
    with pytest.raises(ProviderError) as err:
        complete("billing402")
    assert err.value.failure.kind == "billing" and err.value.failure.status == 402
    assert calls_of(fake)[("v-client", "stage1", "billing402")] == (1, 0)


# --- standalone process --------------------------------------------------------------------


def test_standalone_process_serves_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.fake_provider", "--host", "127.0.0.1", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        url = line.split()[-1]
        assert url.startswith("http://127.0.0.1:")
        with httpx.Client(timeout=5) as client:
            assert client.get(f"{url}/admin/health").json()["status"] == "ok"
            r = client.post(
                f"{url}/v1/chat/completions",
                json={"model": "careful", "messages": [{"role": "user", "content": STAGE1}]},
            )
            assert json.loads(r.json()["choices"][0]["message"]["content"])["verdict"] == "fail"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert proc.stderr is not None and proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
