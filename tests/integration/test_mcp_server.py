"""The MCP server driven by the SDK's own client: `llm-council mcp` over stdio (as Claude Code
or Cursor launch it) and over streamable HTTP, against a fixture repository, with the council
pointed at the fake provider through the environment."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.helpers import CLEAN_CODE, SQL_INJECTION, GitRepo

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("llm-council"))
MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")
TOKEN = "mcp-test-token"


def council_env(fake) -> dict[str, str]:
    base = fake.openai_base
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLM_COUNCIL_") or k.startswith("LLM_COUNCIL_TEST_")
    }
    env.update(
        {
            "LLM_COUNCIL_MODELS": ",".join(f"openai-compat@{base}:{m}" for m in MEMBERS),
            "LLM_COUNCIL_CHAIRMAN": f"openai-compat@{base}:careful-chair",
        }
    )
    return env


def structured(result) -> dict:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return dict(result.structured_content)
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.is_error, result
    return " ".join(getattr(c, "text", "") for c in result.content)


@pytest.fixture
def project(tmp_path: Path) -> tuple[GitRepo, str]:
    repo = GitRepo(tmp_path / "proj")
    repo.commit("init", {"app.py": CLEAN_CODE})
    sha = repo.commit("add query", {"db.py": SQL_INJECTION})
    return repo, sha


def test_verify_status_and_audit_over_stdio(project, fake_provider, tmp_path):
    repo, sha = project
    params = StdioServerParameters(
        command=CLI,
        args=["mcp", "--repo", str(repo.root), "--client-budget", "100"],
        env=council_env(fake_provider),
        cwd=str(repo.root),
    )

    async def session() -> dict:
        out: dict = {}
        async with Client(params, read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"verify", "verify_status", "audit"}
            desc = tools["verify"].description or ""
            for needle in ("quick 60 s", "balanced 180 s", "high 360 s", "reasoning 1200 s"):
                assert needle in desc, desc
            assert "repo_root" in json.dumps(tools["verify"].input_schema)

            # quick: its 60 s deadline fits the 100 s budget, so verify blocks.
            payload = structured(
                await client.call_tool("verify", {"snapshot_id": sha, "tier": "quick"})
            )
            assert payload["verdict"] == "fail" and payload["exit_code"] == 1
            assert payload["coverage"]["reviewed"] == ["db.py"]
            out["quick"] = payload

            # balanced: 180 s > 100 s, so verify answers at once with a handle.
            handle = structured(await client.call_tool("verify", {"snapshot_id": sha}))
            assert "verdict" not in handle and handle["verify_deadline_s"] == 180.0
            vid = handle["verification_id"]
            assert "verify_status" in handle["next"]
            end = time.time() + 30
            while True:
                st = structured(await client.call_tool("verify_status", {"verification_id": vid}))
                if st["state"] == "done" or time.time() > end:
                    break
                await anyio.sleep(0.1)
            assert st["state"] == "done" and st["payload"]["verdict"] == "fail", st
            out["balanced"] = st["payload"]

            # wait=false forces a handle even when the deadline fits.
            handle = structured(
                await client.call_tool(
                    "verify",
                    {
                        "snapshot_id": sha,
                        "tier": "quick",
                        "wait": False,
                        "repo_root": str(repo.root),
                    },
                )
            )
            assert handle["state"] in ("queued", "stage1", "stage2", "chairman")

            # Bad arguments are tool errors that say what was wrong.
            assert "unknown tier" in error_text(
                await client.call_tool("verify", {"snapshot_id": sha, "tier": "huge"})
            )
            assert "'..'" in error_text(
                await client.call_tool("verify", {"snapshot_id": sha, "target_paths": ["../x"]})
            )
            assert "outside the allowed roots" in error_text(
                await client.call_tool("verify", {"repo_root": str(tmp_path)})
            )
            assert "names no commit" in error_text(
                await client.call_tool("verify", {"snapshot_id": "nope"})
            )
            assert "no verification" in error_text(
                await client.call_tool("verify_status", {"verification_id": "0" * 32})
            )

            listing = structured(await client.call_tool("audit", {"validate_integrity": True}))
            ids = {t["verification_id"] for t in listing["transcripts"]}
            assert {out["quick"]["verification_id"], vid} <= ids
            done = [t for t in listing["transcripts"] if t["finished"]]
            assert done and all(t["integrity_ok"] for t in done), listing

            one = structured(
                await client.call_tool(
                    "audit", {"verification_id": vid, "validate_integrity": True}
                )
            )
            assert one["integrity"] == {"checked": True, "ok": True, "problems": []}
            assert one["result"]["verdict"] == "fail"
            assert "result.json" in one["files"]

            # Alter a transcript file: the same audit now fails its integrity check.
            stage1 = Path(one["location"]) / "stage1.json"
            stage1.write_text(stage1.read_text().replace("careful-1", "careful-X", 1))
            one = structured(
                await client.call_tool(
                    "audit", {"verification_id": vid, "validate_integrity": True}
                )
            )
            assert one["integrity"]["ok"] is False
            assert "stage1.json was altered" in one["integrity"]["problems"]
            assert "no transcript" in error_text(
                await client.call_tool("audit", {"verification_id": "f" * 32})
            )
        return out

    runs = anyio.run(session)
    # The runs are recorded: `llm-council history` in the repository lists them as MCP runs.
    proc = subprocess.run(
        [CLI, "history", "--output-format", "json"],
        cwd=repo.root,
        env=council_env(fake_provider),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    items = {i["verification_id"]: i for i in json.loads(proc.stdout)["items"]}
    for payload in runs.values():
        assert items[payload["verification_id"]]["source"] == "mcp"
        assert items[payload["verification_id"]]["verdict"] == "fail"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_streamable_http_transport_with_token(project, fake_provider):
    import httpx
    import httpx2

    repo, sha = project
    port = _free_port()
    env = council_env(fake_provider)
    env["LLM_COUNCIL_API_TOKEN"] = TOKEN
    proc = subprocess.Popen(
        [CLI, "mcp", "--transport", "http", "--port", str(port), "--repo", str(repo.root)],
        cwd=repo.root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        end = time.time() + 20
        while True:
            try:
                r = httpx.post(url, json={}, timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.time() < end, "MCP HTTP server did not start"
                time.sleep(0.1)
        assert r.status_code == 401  # no token

        async def session() -> dict:
            async with httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as http:
                from mcp.client.streamable_http import streamable_http_client

                async with Client(streamable_http_client(url, http_client=http)) as client:
                    return structured(
                        await client.call_tool("verify", {"snapshot_id": sha, "tier": "quick"})
                    )

        payload = anyio.run(session)
        assert payload["verdict"] == "fail"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
