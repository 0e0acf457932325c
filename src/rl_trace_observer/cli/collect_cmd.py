"""``rl-trace collect``: bring every node's artifacts to one directory or object store over Ray.

A thin shell over ``integrations.ray.collect.collect``: Ray is imported only when the command runs,
so ``rl-trace --help`` stays fast on machines without Ray.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .node_dirs import node_dirs

MAX_PROBLEM_LINES = 50


def _steps(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a comma list of step numbers", param_hint="--steps"
        ) from None


def _convert(
    to: str,
    fmt: str,
    address: str | None,
    run: str | None,
    output_dir: str | None,
    nodes: dict[str, str],
    node_workers: int,
    strict: bool,
) -> int:
    """``--convert``: ``rl-trace merge --ray`` into TO/<run_id>/ (an object store gets the files after)."""
    import shutil
    import tempfile

    import fsspec

    from ..cluster.merge import ClusterOptions, ray_merge
    from ..merge.options import MergeOptions, UsageError
    from .merge_cmd import _report

    local = to[len("file://") :] if to.startswith("file://") else to
    remote = "://" in local
    base = tempfile.mkdtemp(prefix="rl-trace-convert-") if remote else local
    opts = MergeOptions(run=run, shards=f"{base}/{{run_id}}/shards", strict=strict)
    cluster = ClusterOptions(
        address=address, output_dir=output_dir, node_output_dirs=nodes, node_workers=node_workers
    )
    try:
        result = ray_merge(f"{base}/{{run_id}}/trace.{fmt}", opts, cluster)
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    code = _report([result])
    if remote:
        run_dir = str(Path(result.output).parent)
        target = f"{to.rstrip('/')}/{Path(run_dir).name}"
        try:
            fs, path = fsspec.core.url_to_fs(target)
            fs.put(run_dir, path, recursive=True)
            typer.echo(f"uploaded to {target}", err=True)
        except Exception as exc:
            typer.echo(f"error: cannot upload to {target}: {exc} (the files are in {run_dir})", err=True)
            return 1
        shutil.rmtree(base, ignore_errors=True)
    return code


def register(app: typer.Typer) -> None:
    @app.command("collect", short_help="Copy every node's RL_TRACE_OUTPUT_DIR over Ray into one place.")
    def collect_command(
        to: str = typer.Option(
            ..., "--to", help="Directory or fsspec URL (s3://, gs://, file://) to collect into."
        ),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address (default: auto)."),
        run: str | None = typer.Option(None, "--run", help="Run id (default: the one run the records name)."),
        output_dir: str | None = typer.Option(
            None, "--output-dir", help="Directory to read on every node (default: RL_TRACE_OUTPUT_DIR)."
        ),
        node_dir: Annotated[
            list[str] | None,
            typer.Option(
                "--node-dir",
                help="KEY=DIR for one node (KEY: node id, custom resource name or IP); repeatable.",
            ),
        ] = None,
        max_nodes: int = typer.Option(4, "--max-nodes", min=1, help="Nodes copied at the same time."),
        chunk_mib: float = typer.Option(
            8.0, "--chunk-mib", min=0.0625, help="Chunk size streamed through Ray."
        ),
        retries: int = typer.Option(
            3, "--retries", min=0, help="Re-reads of a file that changes while read."
        ),
        steps: str | None = typer.Option(
            None, "--steps", help="Profiled steps every profiled rank should have."
        ),
        strict: bool = typer.Option(
            False, "--strict", help="Exit 1 when anything is missing, refused or failed."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of a table."),
        convert: bool = typer.Option(
            False,
            "--convert",
            help="Merge on the nodes instead of copying raw files: TO/<run_id>/trace.FORMAT + shards/.",
        ),
        fmt: str = typer.Option(
            "pftrace.gz", "--format", help="--convert: pftrace.gz, pftrace, json.gz or json."
        ),
        node_workers: int = typer.Option(
            1, "--node-workers", min=0, help="--convert: worker processes per node (each ~0.5 GB more)."
        ),
    ) -> None:
        """Collect RL_TRACE_OUTPUT_DIR from every node of a live Ray cluster into TO/<run_id>/<node>/."""
        from ..integrations.ray.collect import collect
        from ..integrations.ray.collect_expect import AmbiguousRun
        from .errors import check_output

        check_output(to.removeprefix("file://"), "--to", directory=True)
        err = Console(stderr=True)
        try:
            import ray  # noqa: F401
        except ImportError:
            typer.echo("error: rl-trace collect needs Ray: pip install 'rl-trace-observer[ray]'", err=True)
            raise typer.Exit(1) from None
        if convert:
            raise typer.Exit(
                _convert(to, fmt, address, run, output_dir, node_dirs(node_dir), node_workers, strict)
            )
        try:
            report = collect(
                to,
                address=address,
                run_id=run,
                output_dir=output_dir,
                node_output_dirs=node_dirs(node_dir),
                max_nodes=max_nodes,
                chunk_size=int(chunk_mib * 1024 * 1024),
                retries=retries,
                profiled_steps=_steps(steps),
                console=err,
            )
        except AmbiguousRun as exc:
            raise typer.BadParameter(str(exc), param_hint="--run") from None
        except ConnectionError as exc:
            typer.echo(f"error: cannot reach a Ray cluster ({exc}); start one or pass --address", err=True)
            raise typer.Exit(1) from None
        except (OSError, ValueError) as exc:
            typer.echo(f"error: {to}: {exc}", err=True)
            raise typer.Exit(1) from None
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=1, default=str))
        else:
            out = Console()
            report.render(out if out.is_terminal else Console(width=200))  # logs: never truncate cells
        from ..common.visible import visible

        problems = report.problems()  # they name hosts and files: never raw on the terminal
        for line in problems[:MAX_PROBLEM_LINES]:
            typer.echo(f"warning: {visible(line)}", err=True)
        if len(problems) > MAX_PROBLEM_LINES:
            typer.echo(
                f"warning: … and {len(problems) - MAX_PROBLEM_LINES} more (see the report JSON)", err=True
            )
        if problems:
            typer.echo("warning: re-run the same command to retry; --strict makes this an error", err=True)
        landed = any(n.files_copied or n.files_skipped for n in report.nodes)
        if (strict and not report.ok) or not landed:
            raise typer.Exit(1)
        typer.echo(f"next: rl-trace merge {report.run_dir}", err=as_json)
