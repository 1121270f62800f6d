"""Offline fake LLM provider: a real loopback HTTP server speaking the OpenAI chat-completions
and Anthropic Messages API shapes, so the council runs end to end with no network.

Start it in-process::

    with FakeProvider() as fake:  # 127.0.0.1, a free port
        ref = f"openai-compat@{fake.openai_base}:careful-a"
        # or f"anthropic@{fake.anthropic_base}:careful-a"; fake.model_id("careful-a")
        ...
        fake.calls()    # [{verification, stage, model, calls, completed}]
        fake.prompts()  # every request: {verification, stage, model, api, system, prompt, ...}

or standalone: ``python -m ops.fake_provider --host 127.0.0.1 --port 8765``.

The model name (the API ``model`` field) selects a behaviour by prefix:

careful         detects real defects in the subject (SQL built by string formatting, eval/exec
                on non-literals, hard-coded credentials: critical; bare except + pass: major)
lenient         always pass, no findings, confidence 0.8, ranks responses in the order given
unsure          careful with confidence 0.3
contradict      chairman says fail with no critical finding; careful in other stages
prose           careful JSON wrapped in prose and a ```json fence
slow[-MS]       careful after MS milliseconds (default 2000)
flaky429        429 (retry-after: 1, retry-after-ms: 50) on the first call per
                (verification, stage, model), then careful; flaky429always: always 429
flaky500        500 on the first call per key, then careful; flaky500always: always 500
hang            never answers (up to 600 s); released when the server stops
malformed       invalid JSON text
truncated       careful JSON cut in half, finish_reason "length" / stop_reason "max_tokens"
auth401         401 invalid key
billing402      402 with the provider's billing error body
error200        HTTP 200 carrying {"error": {"code": 502, ...}} and no choices

Unknown model names get a 404 model-not-found error in the API's shape. Injected faults
(``configure(faults=...)`` / ``POST /admin/config``) accept the same names plus ``http500``
and ``http429``.
"""

from ops.fake_provider.server import BEHAVIOURS, FAULT_BEHAVIOURS, FakeProvider

__all__ = ["BEHAVIOURS", "FAULT_BEHAVIOURS", "FakeProvider"]
