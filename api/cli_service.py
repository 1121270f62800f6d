"""Commands registered on the `llm-council` app (filled in by their feature)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`. Keep heavy imports inside the commands."""
    return None
