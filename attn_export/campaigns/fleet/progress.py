"""The live table: one row per point (queued, running on which node, cached, passed, failed, needs-node)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

__all__ = ["FleetTable"]


class FleetTable(AbstractContextManager["FleetTable"]):
    """A rich Live table, refreshed at each update; silent (still tracking) when ``show`` is False (--json, --quiet)."""

    def __init__(self, keys: list[str], show: bool, console: Console | None = None) -> None:
        self.rows: dict[str, tuple[str, str, str]] = {k: ("queued", "", "") for k in keys}
        self.live = Live(self._render(), console=console or Console(stderr=True), auto_refresh=False) if show else None

    def _render(self) -> Table:
        table = Table(title="fleet")
        for col in ("point", "status", "node", "detail"):
            table.add_column(col, overflow="fold")
        for key, (status, node, detail) in self.rows.items():
            table.add_row(key, status, node, detail)
        return table

    def update(self, key: str, status: str, record: dict[str, Any] | None) -> None:
        rec = record or {}
        if status == "cached":
            detail = "cache hit: nothing rebuilt"
        elif "accuracy" in rec:
            detail = f"cos {rec['accuracy']['cosine']:.5f}, p50 {rec['latency_ms']:.3f} ms" + (" (stand-in)" if rec.get("stand_in") else "")
        else:
            detail = rec.get("reason", "")
        self.rows[key] = (status, str(rec.get("node", "")), detail)
        if self.live is not None:
            self.live.update(self._render(), refresh=True)

    def __enter__(self) -> FleetTable:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
