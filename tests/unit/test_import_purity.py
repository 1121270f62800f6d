"""Dependencies point inward: `shared` imports no framework, and the verdict engine is pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_SHARED = {
    "celery",
    "kombu",
    "fastapi",
    "sqlmodel",
    "sqlalchemy",
    "redis",
    "uvicorn",
    "starlette",
    "mcp",
    "flower",
    "api",
    "worker",
}
VERDICT_ALLOWED = {"__future__", "collections", "typing", "pydantic", "shared"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    "path", sorted((ROOT / "shared").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_shared_imports_no_framework(path):
    bad = _imports(path) & FORBIDDEN_IN_SHARED
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_verdict_engine_imports_only_models_and_stdlib():
    for name in ("verdict.py", "response.py"):
        mods = _imports(ROOT / "shared" / name)
        assert mods <= VERDICT_ALLOWED, f"{name} imports {sorted(mods - VERDICT_ALLOWED)}"


def test_importing_the_embedded_gate_path_loads_no_framework():
    code = (
        "import sys, api.cli, api.gate, shared.embedded, shared.pipeline, shared.selection;"
        "heavy = {'celery','fastapi','sqlmodel','uvicorn','kombu','redis'} & "
        "{m.split('.')[0] for m in sys.modules}; print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
