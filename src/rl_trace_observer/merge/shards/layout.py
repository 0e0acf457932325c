"""Where span shards live in their directory, and the document that says which parts belong.

```
DIR/rl-trace-shards.json                     the document (written last, atomically): which parts
DIR/manifest.json                            a copy of the merge manifest (clock, artifacts, problems)
DIR/step=<n>/host=<h>/part-<job>-<tag>.parquet
```

Partition directories use Hive's ``key=value`` names (``__HIVE_DEFAULT_PARTITION__`` for a null step,
the host percent-encoded where it has unusual characters), so DuckDB and pyarrow prune by step and
host from the paths alone; every column is in the files as well. A part is written under a hidden
temporary name and renamed when complete. Only the parts the document lists belong to the shards:
a reader never globs, and parts of an earlier merge that the new document does not list are deleted
after it is written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from ...common.atomic import write_atomic
from ...common.encoding import dumps_pretty
from .schema import DOC_NAME, DOC_SCHEMA, MANIFEST_NAME, NULL_PARTITION

_PART = re.compile(r"^part-\d+-[\w.-]+\.parquet$")


class ShardsError(ValueError):
    """A shard directory that cannot be read; the message names it and what is wrong."""


def partition_dir(step: int | None, host: str) -> str:
    return f"step={NULL_PARTITION if step is None else step}/host={quote(host, safe='') or NULL_PARTITION}"


def part_name(job: int, tag: str) -> str:
    return f"part-{job:06d}-{tag}.parquet"


def doc_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / DOC_NAME


def is_shards_dir(path: str | os.PathLike[str]) -> bool:
    return doc_path(path).is_file()


def write_doc(root: Path, doc: dict[str, Any], manifest: dict[str, Any] | None) -> None:
    """The document last (its presence means complete), then the parts it no longer lists go."""
    root.mkdir(parents=True, exist_ok=True)
    if manifest is not None:
        write_atomic(root / MANIFEST_NAME, dumps_pretty(manifest))
    write_atomic(doc_path(root), dumps_pretty(doc))
    remove_stale(root, {f["path"] for f in doc.get("files", [])})


def read_doc(root: str | os.PathLike[str]) -> dict[str, Any]:
    path = doc_path(root)
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ShardsError(f"{root}: not a span shard directory (no {DOC_NAME})") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        why = "empty" if isinstance(exc, orjson.JSONDecodeError) and not exc.doc else "cut short or damaged"
        raise ShardsError(
            f"{path}: the shard document is {why} ({exc}); its parts cannot be told from leftovers, "
            "re-run the merge with --shards"
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != DOC_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else None
        raise ShardsError(f"{path}: schema {found!r} is not {DOC_SCHEMA!r} (written by another version?)")
    return doc


def read_manifest(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        data = orjson.loads((Path(root) / MANIFEST_NAME).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def remove_stale(root: Path, keep: set[str]) -> int:
    """Delete part files (and our temporaries) under ``root`` that ``keep`` does not list."""
    removed = 0
    for part in root.glob("step=*/host=*/*"):
        rel = part.relative_to(root).as_posix()
        if rel in keep or not (_PART.match(part.name) or part.name.startswith(".part-")):
            continue
        try:
            part.unlink()
            removed += 1
        except OSError:
            pass
    for folder in sorted(root.glob("step=*/host=*"), reverse=True) + sorted(root.glob("step=*")):
        try:
            folder.rmdir()  # only when empty
        except OSError:
            pass
    return removed
