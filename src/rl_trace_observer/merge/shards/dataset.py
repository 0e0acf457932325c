"""The one loader for span shards: what analysis code (the report, SQL, views) reads them through.

    shards = Shards.open("run-shards/")
    for table in shards.scan(["name", "ts_ns", "dur_ns"], steps=[2]):   # one part at a time
        ...
    shards.dataset()          # a pyarrow Dataset of exactly the listed parts (DuckDB reads it too)

Only the parts the document lists are read (never a glob: leftovers of a crashed merge stay out),
pruned by step and host from the document before any file is opened; ``scan`` yields one part at a
time (memory follows the largest part, not the run). Rows come in the merged trace's order within a
part (``job``, ``ordinal``); :func:`trace_order` sorts a table that way.

A part can be damaged after the merge (a disk filled, a copy cut short, a file deleted):
:meth:`Shards.whole` checks each listed part against the document (there, its size, its Parquet footer,
its row count) and gives the shards without the damaged ones, each named with what is wrong in
``missing`` — the readers answer from the whole parts and say which are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .arrow import parquet, pyarrow
from .layout import ShardsError, read_doc, read_manifest
from .schema import NAMES, SPAN_SCHEMA


@dataclass
class Shards:
    root: Path
    doc: dict[str, Any]
    missing: list[dict[str, str]] = field(default_factory=list)  # damaged parts left out (:meth:`whole`)

    @classmethod
    def open(cls, root: str | Path) -> Shards:
        doc = read_doc(root)
        if doc.get("span_schema") != SPAN_SCHEMA:
            raise ShardsError(f"{root}: span schema {doc.get('span_schema')!r} is not {SPAN_SCHEMA!r}")
        return cls(Path(root), doc)

    def whole(self) -> Shards:
        """These shards without the parts that are not whole (named in ``missing``); raises
        :class:`ShardsError` when no listed part is whole."""
        pq = parquet()
        missing = []
        for part in self.parts():
            why = _damage(self.root / part["path"], part, pq)
            if why is not None:
                missing.append({"path": str(part["path"]), "why": why})
        if not missing:
            return self
        bad = {m["path"] for m in missing}
        files = [f for f in self.doc.get("files") or [] if f["path"] not in bad]
        if not files:
            first = missing[0]
            raise ShardsError(f"{self.root / first['path']}: {first['why']}, and no listed part is whole")
        doc = {**self.doc, "files": files, "rows": sum(int(f.get("rows") or 0) for f in files)}
        return Shards(self.root, doc, missing)

    def missing_line(self) -> str | None:
        """One line naming the parts left out and what is wrong with the first, or None."""
        if not self.missing:
            return None
        n, total = len(self.missing), len(self.missing) + len(self.doc.get("files") or [])
        first = self.missing[0]
        more = (
            f" (+{n - 1} more: {', '.join(m['path'] for m in self.missing[1:4])}{', ...' if n > 4 else ''})"
        )
        return (
            f"{self.root}: {n} of {total} span shard parts left out, {first['path']}: {first['why']}"
            f"{more if n > 1 else ''}; the answers cover the other parts"
        )

    # ----------------------------------------------------------------------------- what is there
    @property
    def base_ns(self) -> int:
        return int(self.doc.get("base_ns") or 0)

    @property
    def rows(self) -> int:
        return int(self.doc.get("rows") or 0)

    @property
    def steps(self) -> dict[int, tuple[int, int]]:
        return {int(k): (int(v[0]), int(v[1])) for k, v in (self.doc.get("steps") or {}).items()}

    @property
    def processes(self) -> list[dict[str, Any]]:
        return list(self.doc.get("processes") or [])

    @property
    def threads(self) -> list[dict[str, Any]]:
        return list(self.doc.get("threads") or [])

    def manifest(self) -> dict[str, Any] | None:
        return read_manifest(self.root)

    def parts(
        self, steps: Iterable[int | None] | None = None, hosts: Iterable[str] | None = None
    ) -> list[dict[str, Any]]:
        """The listed parts, optionally only those of some steps (None: events outside any step) and hosts."""
        want_steps = set(steps) if steps is not None else None
        want_hosts = set(hosts) if hosts is not None else None
        out = []
        for part in self.doc.get("files") or []:
            if want_steps is not None and part.get("step") not in want_steps:
                continue
            if want_hosts is not None and part.get("host") not in want_hosts:
                continue
            out.append(part)
        return out

    def paths(self, **prune: Any) -> list[Path]:
        return [self.root / p["path"] for p in self.parts(**prune)]

    # ---------------------------------------------------------------------------------- reading
    def scan(
        self,
        columns: list[str] | None = None,
        *,
        steps: Iterable[int | None] | None = None,
        hosts: Iterable[str] | None = None,
        filter: Any = None,
    ) -> Iterator[Any]:
        """One pyarrow Table per part (``filter``: a pyarrow compute expression, pushed into the read)."""
        pq = parquet()
        cols = list(columns) if columns is not None else list(NAMES)
        unknown = [c for c in cols if c not in NAMES]
        if unknown:
            raise ValueError(f"unknown span columns {unknown}; the table has {', '.join(NAMES)}")
        for path in self.paths(steps=steps, hosts=hosts):
            try:
                table = pq.read_table(path, columns=cols, filters=filter)
            except FileNotFoundError:
                raise ShardsError(f"{path}: listed in {self.root} but missing (re-run the merge)") from None
            except Exception as exc:  # a damaged part: name it
                raise ShardsError(f"{path}: unreadable span shard ({type(exc).__name__}: {exc})") from None
            yield table

    def table(self, columns: list[str] | None = None, **kw: Any) -> Any:
        """Every selected row at once, in trace order: for small selections (one step, one host)."""
        pa = pyarrow()
        tables = list(self.scan(columns, **kw))
        if not tables:
            from .schema import arrow_schema

            schema = arrow_schema()
            return schema.empty_table().select(columns) if columns else schema.empty_table()
        out = pa.concat_tables(tables)
        return trace_order(out) if {"job", "ordinal"} <= set(out.column_names) else out

    def dataset(self) -> Any:
        """A pyarrow Dataset over exactly the listed parts (for DuckDB: ``duckdb.from_arrow(...)``)."""
        import pyarrow.dataset as ds

        from .schema import arrow_schema

        return ds.dataset([str(p) for p in self.paths()], schema=arrow_schema(), format="parquet")


def _damage(path: Path, part: dict[str, Any], pq: Any) -> str | None:
    """What is wrong with a listed part file, or None when it is whole as far as the document says."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing (deleted or never copied)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    want = part.get("bytes")
    if size == 0:
        return f"empty (0 bytes; the merge wrote {want})" if want else "empty (0 bytes)"
    if isinstance(want, int) and size != want:
        return f"{size} bytes where the merge wrote {want} (cut short or overwritten)"
    try:
        rows = pq.read_metadata(path).num_rows
    except Exception as exc:  # a damaged footer: pyarrow's own words, one line
        return f"not a readable Parquet file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    if isinstance(part.get("rows"), int) and rows != part["rows"]:
        return f"holds {rows} rows where the merge wrote {part['rows']}"
    return None


def trace_order(table: Any) -> Any:
    """Rows in the order the merged trace holds them (job, then position in the job)."""
    return table.sort_by([("job", "ascending"), ("ordinal", "ascending")])
