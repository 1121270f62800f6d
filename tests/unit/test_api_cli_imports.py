"""`llm-council gate` stays light: the service commands import their frameworks lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("fastapi", "starlette", "sqlmodel", "sqlalchemy", "uvicorn", "mcp", "prometheus_client",
         "psycopg", "api.app", "api.service", "api.db", "api.mcp_server")  # fmt: skip


def test_the_cli_with_service_commands_registered_loads_no_framework():
    code = (
        "import sys, api.cli;"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}];"
        "names = sorted(c.name or c.callback.__name__ for c in api.cli.app.registered_commands);"
        "print(sorted(set(m.split('.')[0] for m in heavy)), names)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    heavy, _, names = out.stdout.strip().partition(" ")
    assert heavy == "[]", out.stdout
    for command in ("serve", "mcp", "audit", "history", "gate"):
        assert command in names, names
