"""Every ``RL_TRACE_*`` environment variable, read and validated in one place.

Training processes read this once per process (and again after ``fork``); invalid values never
raise inside training: they become a warning string in ``Config.problems`` and a safe default.
The README's configuration table is generated from ``SETTINGS`` (``rl-trace config --markdown``)
and a test keeps the two in sync.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One documented variable: its name, its default as text, and what it controls."""

    name: str
    default: str
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "RL_TRACE_OUTPUT_DIR",
        "(unset: capture off)",
        "Absolute directory where each process writes its event log and process record (created if "
        "missing). A relative path turns capture off; an uncreatable, read-only or full one drops "
        "and counts events. Either way: one warning per process, training untouched.",
    ),
    Setting(
        "RL_TRACE_RUN_ID",
        "Ray job id, else `local`",
        "Run identifier stored in every process record; the merger groups artifacts by it.",
    ),
    Setting(
        "RL_TRACE_ROLE",
        "(derived)",
        "Role label for this process (e.g. `trainer`, `actor`, `rollout`); integrations set it "
        "when they know better.",
    ),
    Setting(
        "RL_TRACE_FORWARD_TO_RL_INSIGHT",
        "0",
        "`1`: also forward every RL-Insight event to RL-Insight's original Ray client "
        "(Grafana/Tempo keep working). Needs a real `RL_INSIGHT_SERVER_URL`.",
    ),
    Setting(
        "RL_TRACE_VIZTRACER",
        "0",
        "`1`: wrap VERL's `DistProfiler.start/stop` to record actor call stacks with VizTracer. "
        "Unset: nothing is patched.",
    ),
    Setting(
        "RL_TRACE_VIZTRACER_MIN_DURATION_US",
        "100",
        "VizTracer `min_duration` filter in microseconds (non-negative number).",
    ),
    Setting(
        "RL_TRACE_VIZTRACER_ROLES",
        "(all roles)",
        "Comma list of `DistProfiler` roles that get VizTracer, e.g. `e2e` or `actor,ref`.",
    ),
    Setting(
        "RL_TRACE_REQUESTS",
        "1",
        "`0`: no rollout request spans, weight-sync phases or staleness records (they are on "
        "whenever capture is on); the VERL hooks that write them are then not installed.",
    ),
    Setting(
        "RL_TRACE_AREAL",
        "0",
        "`1` (with capture on): in a process that imports `rl_trace_observer.integrations.areal.register` "
        "(or runs under `python -m rl_trace_observer.integrations.areal`), wrap AReaL's "
        "`perf_tracer.configure` to record its perf_counter origin against the wall clock and register "
        "AReaL's trace and session files, so the merge places every rank's perf trace exactly. "
        "Unset: nothing is patched.",
    ),
    Setting(
        "RL_TRACE_RECORD_INTERVAL_S",
        "1.0",
        "At most this often the process record is rewritten to refresh event counts "
        "(it is always rewritten on identity, artifact and clock changes and at exit).",
    ),
    Setting(
        "RL_TRACE_BUFFER_MB",
        "64",
        "Memory (MiB, per training process) that may hold events its output disk has not taken yet "
        "(a hung or slow mount); beyond it newer events are dropped and counted, with one warning. "
        "Held by the process's drain (a small helper process that does all file writes); the "
        "training process itself holds as much again only while its drain is starved of CPU or stopped.",
    ),
    Setting(
        "RL_TRACE_EXIT_WAIT_S",
        "2.0",
        "At exit a training process waits at most this long for its drain to confirm that every "
        "event is on disk; then it exits anyway and the drain finishes on its own (e.g. after a "
        "frozen mount thaws).",
    ),
    Setting(
        "RL_TRACE_METRICS",
        "1",
        "`0`: no metric sampler. `1` (with capture on): one sampler process per node (elected by a "
        "lock) samples every Prometheus target registered through `rl_insight.update_prometheus_config` "
        "(engines, TransferQueue, exporters), the node's GPUs (NVML) and the host (psutil); see "
        "docs/metrics.md. Registered targets are recorded either way, and never POSTed in local mode.",
    ),
    Setting(
        "RL_TRACE_METRICS_INTERVAL_S",
        "1.0",
        "Seconds between two samples of every source (positive number).",
    ),
    Setting(
        "RL_TRACE_METRICS_PROFILED_INTERVAL_S",
        "0.1",
        "Seconds between two samples while a profiled step runs on the node (positive number).",
    ),
    Setting(
        "RL_TRACE_METRICS_TIMEOUT_S",
        "0.5",
        "Per-scrape timeout of a Prometheus target, in seconds; a target that fails is noted once "
        "and retried with back-off.",
    ),
    Setting(
        "RL_TRACE_METRICS_RETRY_MAX_S",
        "30",
        "Longest back-off between two tries of a dead Prometheus target, in seconds.",
    ),
    Setting(
        "RL_TRACE_METRICS_TARGETS",
        "(none)",
        "Comma list of extra `job=host:port` targets that every node's sampler scrapes on its own "
        "node, e.g. `node=localhost:9100,dcgm=localhost:9400` (exporters not registered through "
        "RL-Insight).",
    ),
    Setting(
        "RL_TRACE_METRICS_NODE_DIR",
        "`<temp dir>/rl-trace-observer-<uid>`",
        "Absolute node-local folder where the processes of a run meet their node's metric sampler "
        "(election locks, member list, targets, profiling flags; one sub-folder per output "
        "directory). Never on the output disk: locks there are unreliable and a stat may hang.",
    ),
    Setting(
        "RL_TRACE_COLLECT_TO",
        "(unset)",
        "Directory or fsspec URL: collect every node's artifacts there when training finishes.",
    ),
    Setting(
        "RL_TRACE_TOKENSPEED_COMMAND",
        "`<python> -m tokenspeed.cli serve`",
        "How the `tokenspeed` rollout starts its server (shell words; the server actor's interpreter "
        "by default). The launcher appends `--model --tp --host --port --control-port "
        "--enable-output-logprobs --enable-memory-saver ...`.",
    ),
    Setting(
        "RL_TRACE_TOKENSPEED_ARGS",
        "(none)",
        "Extra shell words appended to every `tokenspeed serve` command line, e.g. `--enforce-eager`.",
    ),
    Setting(
        "RL_TRACE_TOKENSPEED_STARTUP_TIMEOUT_S",
        "1800",
        "Seconds a TokenSpeed server may take to answer `/health`; then its replica fails with the "
        "server's last log lines.",
    ),
    Setting(
        "RL_TRACE_TOKENSPEED_PROFILE_ACTIVITIES",
        "`VIZTRACER,PROTON`",
        "Comma list of TokenSpeed profiler activities sent with `/start_profile` at VERL's profiled "
        "steps (`CPU`, `GPU`, `MEM`, `CUDA_PROFILER`, `EXPERT_LOAD`, `PROTON`, `VIZTRACER`). Empty: "
        "TokenSpeed is not profiled.",
    ),
    Setting(
        "RL_TRACE_TOKENSPEED_PROFILE_STALL_TIMEOUT_S",
        "300",
        "After `/stop_profile`, give up waiting for a replica's profile files when none grew or "
        "appeared for this many seconds (registered files stay registered).",
    ),
    Setting(
        "RL_TRACE_NATIVE",
        "1",
        "Merger and report only. `0`: run the `.pftrace` encoder's, the fused merge loop's and the "
        "report's GPU analysis' "
        "pure-Python loops even where their compiled twins (built by Cython at install, see "
        "Dependencies) are present, e.g. to compare the two. `1`: use the twins when built and "
        "current (output is identical either way).",
    ),
)

TOKENSPEED_ACTIVITIES = ("CPU", "GPU", "MEM", "CUDA_PROFILER", "EXPERT_LOAD", "PROTON", "VIZTRACER")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class Config:
    """Validated settings for one process. ``problems`` holds one line per rejected value."""

    output_dir: Path | None = None
    run_id: str | None = None
    role: str | None = None
    forward_to_rl_insight: bool = False
    viztracer: bool = False
    viztracer_min_duration_us: float = 100.0
    viztracer_roles: tuple[str, ...] = ()
    requests: bool = True
    areal: bool = False
    record_interval_s: float = 1.0
    buffer_mb: float = 64.0
    exit_wait_s: float = 2.0
    collect_to: str | None = None
    # load() makes it True (RL_TRACE_METRICS defaults to 1); a Config built in code (a tool, a test)
    # starts no sampler process unless it asks for one
    metrics: bool = False
    metrics_interval_s: float = 1.0
    metrics_profiled_interval_s: float = 0.1
    metrics_timeout_s: float = 0.5
    metrics_retry_max_s: float = 30.0
    metrics_targets: tuple[tuple[str, str], ...] = ()
    metrics_node_dir: Path | None = None  # None: <temp dir>/rl-trace-observer-<uid>
    tokenspeed_command: tuple[str, ...] = ()  # empty: `<python> -m tokenspeed.cli serve`
    tokenspeed_args: tuple[str, ...] = ()
    tokenspeed_startup_timeout_s: float = 1800.0
    tokenspeed_profile_activities: tuple[str, ...] = ("VIZTRACER", "PROTON")
    tokenspeed_profile_stall_timeout_s: float = 300.0
    native: bool = True
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def capture_enabled(self) -> bool:
        return self.output_dir is not None


def _flag(env: Mapping[str, str], name: str, problems: list[str], default: bool = False) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw not in _FALSE:
        problems.append(f"{name}={env[name]!r} is not a boolean (use 1 or 0); treating it as {int(default)}")
        return default
    return False


def _number(env: Mapping[str, str], name: str, default: float, problems: list[str]) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and value != float("inf")):
        problems.append(f"{name}={raw!r} must be a non-negative number; using {default:g}")
        return default
    return value


def _positive(env: Mapping[str, str], name: str, default: float, problems: list[str]) -> float:
    value = _number(env, name, default, problems)
    if value == 0:
        problems.append(f"{name}=0 must be positive; using {default:g}")
        return default
    return value


def _targets(env: Mapping[str, str], problems: list[str]) -> tuple[tuple[str, str], ...]:
    """``job=host:port,...`` as ``((job, "host:port"), ...)``; malformed items are dropped, once each."""
    name = "RL_TRACE_METRICS_TARGETS"
    out: list[tuple[str, str]] = []
    for item in env.get(name, "").split(","):
        item = item.strip()
        if not item:
            continue
        job, sep, address = item.partition("=")
        host, colon, port = address.strip().rpartition(":")
        if not sep or not job.strip() or not colon or not host or not port.isdigit():
            problems.append(f"{name}: {item!r} is not job=host:port; ignoring it")
            continue
        out.append((job.strip(), address.strip()))
    return tuple(out)


def _node_dir(env: Mapping[str, str], problems: list[str]) -> Path | None:
    name = "RL_TRACE_METRICS_NODE_DIR"
    raw = env.get(name, "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not path.is_absolute():
        problems.append(f"{name}={raw!r} is not an absolute path; using the temp dir")
        return None
    return path


def _text(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name, "").strip()
    return raw or None


def _words(env: Mapping[str, str], name: str, problems: list[str]) -> tuple[str, ...]:
    raw = env.get(name, "").strip()
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        problems.append(f"{name}={raw!r} is not valid shell words ({exc}); ignoring it")
        return ()


def _activities(env: Mapping[str, str], problems: list[str]) -> tuple[str, ...]:
    name = "RL_TRACE_TOKENSPEED_PROFILE_ACTIVITIES"
    if name not in env:
        return ("VIZTRACER", "PROTON")
    wanted = [a.strip().upper() for a in env[name].split(",") if a.strip()]
    unknown = [a for a in wanted if a not in TOKENSPEED_ACTIVITIES]
    if unknown:
        problems.append(
            f"{name}: unknown activities {', '.join(unknown)} dropped "
            f"(known: {', '.join(TOKENSPEED_ACTIVITIES)})"
        )
    return tuple(dict.fromkeys(a for a in wanted if a in TOKENSPEED_ACTIVITIES))


def _output_dir(env: Mapping[str, str], problems: list[str]) -> Path | None:
    raw = env.get("RL_TRACE_OUTPUT_DIR", "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not path.is_absolute():
        problems.append(
            f"RL_TRACE_OUTPUT_DIR={raw!r} is not an absolute path (Ray workers start in other "
            "directories); capture is off in this process"
        )
        return None
    return path


def load(env: Mapping[str, str] | None = None) -> Config:
    """Read every ``RL_TRACE_*`` variable from ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    problems: list[str] = []
    roles = tuple(r.strip() for r in env.get("RL_TRACE_VIZTRACER_ROLES", "").split(",") if r.strip())
    known = {s.name for s in SETTINGS}
    problems.extend(
        f"{name} is not a known setting (typo?); known: {', '.join(sorted(known))}"
        for name in sorted(env)
        if name.startswith("RL_TRACE_") and name not in known
    )
    return Config(
        output_dir=_output_dir(env, problems),
        run_id=_text(env, "RL_TRACE_RUN_ID"),
        role=_text(env, "RL_TRACE_ROLE"),
        forward_to_rl_insight=_flag(env, "RL_TRACE_FORWARD_TO_RL_INSIGHT", problems),
        viztracer=_flag(env, "RL_TRACE_VIZTRACER", problems),
        viztracer_min_duration_us=_number(env, "RL_TRACE_VIZTRACER_MIN_DURATION_US", 100.0, problems),
        viztracer_roles=roles,
        requests=_flag(env, "RL_TRACE_REQUESTS", problems, default=True),
        areal=_flag(env, "RL_TRACE_AREAL", problems),
        record_interval_s=_number(env, "RL_TRACE_RECORD_INTERVAL_S", 1.0, problems),
        buffer_mb=_positive(env, "RL_TRACE_BUFFER_MB", 64.0, problems),
        exit_wait_s=_number(env, "RL_TRACE_EXIT_WAIT_S", 2.0, problems),
        collect_to=_text(env, "RL_TRACE_COLLECT_TO"),
        metrics=_flag(env, "RL_TRACE_METRICS", problems, default=True),
        metrics_interval_s=_positive(env, "RL_TRACE_METRICS_INTERVAL_S", 1.0, problems),
        metrics_profiled_interval_s=_positive(env, "RL_TRACE_METRICS_PROFILED_INTERVAL_S", 0.1, problems),
        metrics_timeout_s=_positive(env, "RL_TRACE_METRICS_TIMEOUT_S", 0.5, problems),
        metrics_retry_max_s=_positive(env, "RL_TRACE_METRICS_RETRY_MAX_S", 30.0, problems),
        metrics_targets=_targets(env, problems),
        metrics_node_dir=_node_dir(env, problems),
        tokenspeed_command=_words(env, "RL_TRACE_TOKENSPEED_COMMAND", problems),
        tokenspeed_args=_words(env, "RL_TRACE_TOKENSPEED_ARGS", problems),
        tokenspeed_startup_timeout_s=_number(env, "RL_TRACE_TOKENSPEED_STARTUP_TIMEOUT_S", 1800.0, problems),
        tokenspeed_profile_activities=_activities(env, problems),
        tokenspeed_profile_stall_timeout_s=_number(
            env, "RL_TRACE_TOKENSPEED_PROFILE_STALL_TIMEOUT_S", 300.0, problems
        ),
        native=_flag(env, "RL_TRACE_NATIVE", problems, default=True),
        problems=tuple(problems),
    )


_WARNED: set[tuple[int, str]] = set()  # (pid, problem): each said once per process


def warn_problems(config: Config) -> None:
    """Log each of ``config.problems`` once per process (a warning, never an exception).

    Called wherever a process decides whether to capture (its first recorder, the RL-Insight
    backend's installation), so a value that turns capture off, such as a relative
    ``RL_TRACE_OUTPUT_DIR``, is said once even though no recorder is ever made."""
    import logging

    pid = os.getpid()
    for problem in config.problems:
        key = (pid, problem)
        if key in _WARNED:
            continue
        _WARNED.add(key)
        logging.getLogger("rl_trace_observer").warning("[rl-trace-observer] pid %s: %s", pid, problem)


def markdown_table() -> str:
    """The README's configuration table, generated so it cannot drift from the code."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{s.name}` | {s.default} | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)


def as_dict(config: Config) -> dict[str, Any]:
    """JSON-ready view for process records and ``rl-trace config``."""
    out: dict[str, Any] = {}
    for key, value in config.__dict__.items():
        conv: Callable[[Any], Any] = str if isinstance(value, Path) else (lambda v: v)
        out[key] = list(value) if isinstance(value, tuple) else conv(value)
    return out


# Not a setting (no ``RL_TRACE_`` prefix, not in the README): tests set it to stop a merge at a named
# point of its commit — ``<point>=<ready file>`` — so that they can ``kill -9`` it exactly there.
TEST_PAUSE_VAR = "_RLTO_TEST_PAUSE"


def pause_requested(point: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The ready file to create before pausing at ``point``, when a test asked for that point."""
    value = (os.environ if env is None else env).get(TEST_PAUSE_VAR, "")
    name, sep, ready = value.partition("=")
    return Path(ready) if sep and name == point and ready else None
