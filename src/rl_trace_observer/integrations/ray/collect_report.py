"""What ``rl-trace collect`` did, per node, and how it is shown: live progress and the final table.

Partial failure is the normal case on a large cluster (a node gone, a file still being written), so
every problem lands in exactly one list of one ``NodeReport`` (or the run-level ``coverage``), is
printed once in the summary, and is written to ``DEST/<run_id>/.rl-trace-collect-report.json``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

# Node outcomes, worst last; ``ok`` statuses need no action from the user.
OK_STATUSES = ("complete", "shared", "empty", "restarted", "collected-earlier")
STATUSES = (*OK_STATUSES, "partial", "lost", "unreachable", "dead")


@dataclass
class NodeReport:
    """One Ray node: what was found there, what landed, and every problem with its reason."""

    node_id: str
    address: str
    label: str = ""
    hostname: str | None = None
    output_dir: str | None = None
    status: str = "complete"
    shared_with: str | None = None
    files_found: int = 0
    files_copied: int = 0
    files_skipped: int = 0  # already verified by an earlier run (sidecar index)
    files_verified: int = 0  # shared directory: checked against the node that copied it
    bytes_found: int = 0
    bytes_copied: int = 0
    retries: int = 0
    seconds: float = 0.0
    refused: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    other_run: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    worker_memory: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES and not (self.failed or self.missing or self.refused)


@dataclass
class CollectReport:
    """The result of one ``collect()`` call; ``ok`` is False when anything needs the user's attention."""

    dest: str
    run_id: str
    run_dir: str
    nodes: list[NodeReport] = field(default_factory=list)
    coverage: list[str] = field(default_factory=list)  # run-level expected-vs-found gaps
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes) and not self.coverage

    @property
    def bytes_copied(self) -> int:
        return sum(n.bytes_copied for n in self.nodes)

    def node(self, label_or_id: str) -> NodeReport:
        for n in self.nodes:
            if label_or_id in (n.label, n.node_id):
                return n
        raise KeyError(label_or_id)

    def problems(self) -> list[str]:
        """One line per thing the user should know about, in node order, then run-level gaps."""
        lines: list[str] = []
        for n in self.nodes:
            who = n.label or n.node_id[:12]
            if n.status not in OK_STATUSES:
                lines.append(f"{who}: node {n.status}" + (f" ({n.notes[0]})" if n.notes else ""))
            lines += [f"{who}: refused {p}: {r}" for p, r in n.refused]
            lines += [f"{who}: failed {p}: {r}" for p, r in n.failed]
            lines += [f"{who}: missing {p}: {r}" for p, r in n.missing]
        return lines + self.coverage

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def render(self, console: Console) -> None:
        table = Table(title=f"rl-trace collect → {self.run_dir}", title_justify="left")
        for col in (
            "node",
            "status",
            "files",
            "copied",
            "skipped",
            "MB copied",
            "MB/s",
            "retries",
            "problems",
        ):
            table.add_column(col, justify="left" if col in ("node", "status") else "right")
        for n in self.nodes:
            rate = n.bytes_copied / 1e6 / n.seconds if n.seconds > 0 else 0.0
            status = n.status if not n.shared_with else f"shared ({n.shared_with})"
            problems = len(n.refused) + len(n.failed) + len(n.missing)
            table.add_row(
                n.label or n.node_id[:12],
                status,
                str(n.files_found),
                str(n.files_copied),
                str(n.files_skipped + n.files_verified),
                f"{n.bytes_copied / 1e6:.1f}",
                f"{rate:.0f}",
                str(n.retries),
                str(problems),
            )
        console.print(table)


class CollectProgress:
    """Bytes, files and nodes while collecting; a silent no-op when not on a terminal."""

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self.files = self.files_total = self.nodes = self.nodes_total = 0
        if enabled:
            self._bar = Progress(
                TextColumn("[bold]collect"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TextColumn("files {task.fields[files]}/{task.fields[files_total]}"),
                TextColumn("nodes {task.fields[nodes]}/{task.fields[nodes_total]}"),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )

    def __enter__(self) -> CollectProgress:
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task(
                "collect", total=0, files=0, files_total=0, nodes=0, nodes_total=0
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def plan(self, files: int, total_bytes: int, nodes: int) -> None:
        with self._lock:
            self.files_total += files
            self.nodes_total += nodes
            self._refresh(total_delta=total_bytes)

    def advance(self, nbytes: int = 0, files: int = 0, nodes: int = 0, extra_total: int = 0) -> None:
        with self._lock:
            self.files += files
            self.nodes += nodes
            self._refresh(advance=nbytes, total_delta=extra_total)

    def _refresh(self, advance: int = 0, total_delta: int = 0) -> None:
        if self._bar is None or self._task is None:
            return
        task = self._bar.tasks[0]
        self._bar.update(
            self._task,
            advance=advance,
            total=(task.total or 0) + total_delta,
            files=self.files,
            files_total=self.files_total,
            nodes=self.nodes,
            nodes_total=self.nodes_total,
        )


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def seconds(self) -> float:
        return round(time.monotonic() - self.start, 3)
