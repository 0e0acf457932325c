"""``rl-trace sql INPUT "SELECT …"``: DuckDB over the span table (a thin shell over
:mod:`rl_trace_observer.analysis.query.sql_format`)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

TABLES_HELP = """Tables: spans (every merged event, docs/FORMATS.md §6), trace (base_ns, source); the
report's own rows, built when the query names them: steps (step, start_ns, end_ns, dur_ns), stage_spans
(run, host, pid, role, rank, step, lane, name, stage, category, ts_ns, dur_ns, end_ns, source, args),
kernels (one row per GPU kernel: step, host, rank, role, device, stream, name, kind, ts_ns, dur_ns,
launch_ts_ns, stage, stage_name, rule, correlation, trace_pid, trace_tid) and gpu_time (the report's
gpu.rows: busy, compute, comm, memory, overlap, idle and its split per scope, step, role, rank, device,
stage); macro stage(name).

Read-only by default: a query reads these tables only - no COPY ... TO, EXPORT, ATTACH, INSTALL/LOAD,
SET, and no read_csv/read_parquet/glob of other files. --allow-file-access lifts this (DuckDB as
is: trust the query as you would a script). Control characters in names are shown escaped (\\x1b,
\\u202e) in the table and in --csv to a terminal; a result too wide for the terminal is printed as one
record per row."""


def register(app: typer.Typer) -> None:
    @app.command(
        "sql", epilog=TABLES_HELP, short_help="Query the run's span table with SQL (DuckDB, offline)."
    )
    def sql_command(
        input: str = typer.Argument(
            ...,
            metavar="INPUT",
            help="Span shards (merge --shards DIR), a merged trace (.json.gz, .pftrace with shards) "
            "or a run directory.",
        ),
        query: str = typer.Argument(
            "SELECT * FROM steps", metavar="QUERY", help="A DuckDB SQL query (default: the steps)."
        ),
        as_csv: bool = typer.Option(False, "--csv", help="Print CSV (every row)."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON array of objects (every row)."),
        output: str | None = typer.Option(
            None, "--output", "-o", help="Write CSV/JSON here instead (.csv or .json: the format too)."
        ),
        allow_file_access: bool = typer.Option(
            False,
            "--allow-file-access",
            help="Let the query read and write files and attach databases (DuckDB unrestricted); "
            "without it a query sees only the run's tables.",
        ),
    ) -> None:
        """Query the run's flat span table with SQL (DuckDB, offline)."""
        from ..analysis.query.sql import SqlError
        from ..analysis.query.sql_format import query as run_query
        from ..analysis.query.sql_format import to_csv, to_json, to_rich
        from ..analysis.report.load import TraceError
        from ..common.visible import visible
        from .errors import check_output, make_parent, require_inputs

        if as_csv and as_json:
            typer.echo("error: give --csv or --json, not both", err=True)
            raise typer.Exit(2)
        if output and not (as_csv or as_json):  # the suffix says which
            as_csv, as_json = output.lower().endswith(".csv"), output.lower().endswith(".json")
            if not (as_csv or as_json):
                typer.echo(
                    f"error: --output {output}: name a .csv or .json file, or give --csv or --json", err=True
                )
                raise typer.Exit(2)
        require_inputs(input)
        check_output(output, "-o/--output")
        try:
            result = run_query(input, query, file_access=allow_file_access)
        except (SqlError, TraceError) as exc:
            line = f"error: {input}: {exc}" if str(input) not in str(exc) else f"error: {exc}"
            typer.echo(visible(line), err=True)
            raise typer.Exit(1) from None
        for note in result.notes:
            typer.echo(visible(f"note: {note}"), err=True)
        if as_csv or as_json:
            tty = not output and sys.stdout.isatty()  # data stays exact in a file or a pipe
            data = to_csv(result, escape=tty).encode() if as_csv else to_json(result)
            if output:
                from ..common.atomic import write_atomic

                make_parent(output)
                write_atomic(Path(output), data)
                typer.echo(f"wrote {output} ({len(result.rows)} rows)", err=True)
            else:
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
            return
        from rich.console import Console

        console = Console()
        console.print(to_rich(result, width=console.width))
