"""``--node-dir KEY=DIR`` (collect, merge --ray): per-node output directories, one parser for both."""

from __future__ import annotations

import typer


def node_dirs(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or ():
        key, sep, path = value.partition("=")
        if not sep or not key or not path:
            raise typer.BadParameter(f"{value!r} is not KEY=DIR", param_hint="--node-dir")
        out[key] = path
    return out
