from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CLI = str(Path(sys.executable).with_name("llm-council"))
MEMBERS = ("careful-1", "careful-2", "careful-3", "lenient-1")


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.stdout)


def council_env(base: str, members=MEMBERS, chairman: str = "careful-chair") -> dict[str, str]:
    return {
        "LLM_COUNCIL_MODELS": ",".join(f"openai-compat@{base}:{m}" for m in members),
        "LLM_COUNCIL_CHAIRMAN": f"openai-compat@{base}:{chairman}",
    }


@pytest.fixture
def gate():
    """Run the installed `llm-council gate` as a user would."""

    def run(repo: Path, *args: str, env: dict[str, str] | None = None, timeout=120) -> Run:
        full_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("LLM_COUNCIL_") or k.startswith("LLM_COUNCIL_TEST_")
        }
        full_env.update(env or {})
        proc = subprocess.run(
            [CLI, "gate", *args],
            cwd=repo,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)

    return run
