"""Where each step's time went: the report's numbers, computed once into a versioned JSON summary.

Input is a merged trace read by :mod:`.load`; output is a plain dict (schema
``rl-trace-report/4``, documented in :data:`SCHEMA_DOC`) that the terminal, HTML and JSON renderers
all present, so the three never disagree. All durations are exact integer nanoseconds on the
merged timeline, computed with interval unions (:mod:`..answers.intervals`), never by adding spans.

Definitions:

- **stage spans**: RL-Insight state spans and step markers (category ``rl_insight*``/``verl``, or an
  ``args.state_lane_id``). A trace without any falls back to spans whose *names* the stage table
  knows. Profiler spans (Torch, VizTracer, Proton) are for Perfetto, not for this breakdown.
- **who**: ``(role, lane)`` — the process's role from the merged process name or args, and the
  RL-Insight lane (``rank_0``, ``replica_1``; else the thread name).
- **step windows**: step-marker spans (:mod:`.stages`), overlapping ones joined; step numbers
  from their ``step`` argument, else 1, 2, … . No markers: one window over every stage span.
- per step and who: time in each category = the window-clipped union of that who's spans of that
  category; **idle** (the bubbles) = window length − union of all its work.
- **overlap**: window-clipped unions over all whos of generation (G) and training (log-prob ∪
  update, T): ``generation_only`` = |G∖T|, ``training_only`` = |T∖G|, ``both`` = |G∩T|, ``neither``.
- **stragglers**: per step, role and stage name with ≥2 lanes: the slowest lane, the median, the lag.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ...merge.timeline.steps import as_int
from ..answers import StepWindow, answer_sections
from ..answers import interval_arrays as ia
from ..answers import intervals as iv
from ..answers.interval_chunks import IntervalChunks
from ..answers.model import RL_BUCKETS, natural
from ..answers.verl_metrics import metric_check
from ..gpu import section as gpu_section
from ..gpu.answers import gpu_answers
from ..gpu.attribute import StageSpan
from .identity import STAGE_CATS, process_identity
from .load import Span, TraceData
from .request_work import replica_generation
from .rollout import CATEGORY_PREFIX as ROLLOUT_CATEGORY_PREFIX
from .rollout import rollout_section
from .span_table import SpanTable, select
from .stage_index import BUCKET_KEY, StageIndex, lanes_of, work_spans
from .stages import (
    CATEGORIES,
    IDLE,
    ROLLOUT_CATEGORIES,
    STAGE_TABLE,
    STEP,
    TRAINING_CATEGORIES,
    WORK_CATEGORIES,
    classify,
    guessable,
    marker_number,
    marker_priority,
)
from .telemetry import METRICS_CAT, telemetry_section
from .windows import Window, process_windows, step_windows

SCHEMA = "rl-trace-report/4"
LONGEST_SHOWN = 10
GANTT_SPANS_PER_LANE = 400
MAX_METRICS = 200
SCHEMA_DOC = """rl-trace-report/4 (/3 plus ``gpu``: :mod:`rl_trace_observer.analysis.gpu`, docs/FORMATS.md
§10, and ``telemetry``: the metric sampler's engines, GPUs and hosts; /3 was /2 plus ``idle``,
``goodput``, ``arrivals``, ``critical_path``: see :mod:`rl_trace_observer.analysis.answers`; /2
added ``rollout``):
{schema, source{path, events, spans_seen, stage_spans, step_markers, stage_source (rl_insight | rl_bucket |
  names | none), guessed{names, refused, refused_total} | null, steps_from, loader, unmatched_ends,
  dropped_events, manifest, merged_by_report, manifest_note (why a manifest beside the trace was not
  used: another merge's, null when none), missing_parts[{path, why}] and missing_note (span shard
  parts left out as damaged: the figures cover the others), read_error (only when the file could
  not be read as it is and was merged first)},
 stage_table[{category, pattern}], categories[],
 steps[{step, start_ns, end_ns, dur_ns, profiled, mode,
        ranks[{role, lane, time_ns{<category>|idle: int}, busy_ns}],
        roles[{role, ranks, total_ns{...}, mean_ns{...}}],
        overlap{generation_only_ns, training_only_ns, both_ns, neither_ns}}],
 overlap{...the same, over the whole run},
 stragglers[{step, role, stage, category, lanes, slowest_lane, slowest_ns, median_ns, lag_ns, lag_pct}],
 longest_spans[{name, category, cat, process, thread, step, start_ns, dur_ns}],
 metrics[{name, steps[{step, mean, last, min, max, count}]}],
 gantt{step, start_ns, end_ns, lanes[{role, lane, spans[[offset_ns, dur_ns, name, category]], truncated}]},
 clock{mode, quality, why, hosts[...], ...} , artifacts{status, files, by_kind, incomplete, skipped,
  problems, problem_count, missing, counts, metrics[<manifest metrics entry>]} | null,
 rollout{requests, validation_requests, client_spans, server_spans, linked, failed, rejected, tail_quantile,
  steps[{step, requests, rejected, first_start_ns, last_end_ns, latency_ns{p50,p95,p99,max,mean},
         server_latency_ns,
         phases_ns{queue|prefill|decode: {...}}, tail{t90_ns, end_ns, dur_ns, requests, request_ids[],
         trainer_ns{<category>|idle}}, replicas[{replica, requests, prompt_tokens, response_tokens,
         busy_ns, tokens_per_s}], imbalance{requests, response_tokens, busy_ns}, slowest[<request row>]}],
  slowest[{request_id, step, replica, start_ns, latency_ns, server_ns, queue_ns, prefill_ns, decode_ns,
           turn, turns, attempt, sample, session, status, version, response_tokens, seen_by}],
  weight_sync{syncs[{step, version, backend, start_ns, dur_ns, trainer_phases_ns{},
              replicas[{replica, dur_ns, phases_ns{}, bytes, processes}], slowest_replica}],
              phase_totals_ns{trainer{}, replica{}}} | null,
  staleness[{step, trainer_version, samples, lag_steps{<lag>: count}, max_lag_steps, mean_lag_steps,
             unknown_version, start_ns, wait_ns}]} | null,
 idle{causes[], steps[{step, dur_ns, lanes[{role, lane, kind, idle_ns, causes_ns{<cause>: int}}]}],
      roles[{role, lanes, idle_ns, causes_ns{}}]},
 goodput{buckets[], steps[{step, dur_ns, roles[{role, lanes, productive_ns, overhead_ns, idle_ns,
         wasted_ns}]}], roles[{role, wall_ns, productive_ns, overhead_ns, idle_ns, wasted_ns,
         productive_pct}]},
 arrivals{events[{step, point, role, lanes, last_lane, arrival_ns, lag_ns, spread_ns}], events_total,
          summary[{role, point, lane, last_in, steps, median_lag_ns, max_lag_ns, median_spread_ns}]},
 critical_path[{step, start_ns, dur_ns, segments[{role, lane, name, stage, start_ns, dur_ns}],
                segments_total, by_stage_ns{<stage>|gap: int}, what_if[{stage, on_path_ns, share_pct,
                saving_ns{"10"|"25"|"50": int}}]}],
 metric_check{threshold_pct, disagreements, rows[{metric, step, unit (ns | ratio), verl, ours, diff_pct,
              disagree}]} | null,
 gpu{kernels, untracked_events, rules{launch, window}, no_stage, no_step, kinds{}, kernel_wait_below_ns,
     rows[{scope, step, role, rank, host, device, stage, kernels, span_ns, wall_ns, busy_ns, compute_ns,
           comm_ns, memory_ns, overlap_ns, idle_ns, host_wait_ns, kernel_wait_ns, other_wait_ns,
           launch_delay_p50_ns, launch_delay_p95_ns, launch_delay_max_ns}],
     devices[{role, rank, host, device, streams[], top_kernels[]}], top_kernels[],
     idle_while[{step, role, rank, device, gpu_idle_ns, while_ns{}}]} | null,
 telemetry{engines[{step, replica, process, running_mean, running_max, waiting_mean, waiting_max,
                    kv_cache_max, preemptions, prompt_tokens{,_low,_high,_per_s},
                    generation_tokens{,_low,_high,_per_s}, span_prompt_tokens, span_generation_tokens,
                    span_generation_tokens_per_s, disagrees}],
           gpus[{step, role, stage, mean, max, spans, memory_max_bytes}],
           host_cpu[{step, role, stage, mean, max, spans}], gpu_note, slack_pct} | null
           (the metric sampler's tracks: :mod:`.telemetry`, docs/metrics.md)}.
Additive changes keep the version; renames or removals bump it."""


# ------------------------------------------------------------------------------------ per step
def _rank_rows(idx: StageIndex, w: Window) -> list[dict[str, Any]]:
    rows = []
    span_ns = w.end_ns - w.start_ns
    for who in idx.whos:
        cats = idx.by_who_cat[who]
        times = {c: ia.covered(cats.get(c, ()), w.start_ns, w.end_ns) for c in WORK_CATEGORIES}
        busy = ia.covered(IntervalChunks.join(cats.get(c) for c in WORK_CATEGORIES), w.start_ns, w.end_ns)
        times[IDLE] = span_ns - busy
        rows.append({"role": who.role, "lane": who.lane, "time_ns": times, "busy_ns": busy})
    return rows


def _role_rows(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ranks:
        grouped[row["role"]].append(row)
    out = []
    for role, rows in grouped.items():
        total = {c: sum(r["time_ns"][c] for r in rows) for c in CATEGORIES}
        mean = {c: total[c] / len(rows) for c in CATEGORIES}
        out.append({"role": role, "ranks": len(rows), "total_ns": total, "mean_ns": mean})
    return out


def overlap(idx: StageIndex, lo: int, hi: int) -> dict[str, int]:
    gen = ia.clipped_union(IntervalChunks.join(idx.all_by_cat.get(c) for c in ROLLOUT_CATEGORIES), lo, hi)
    train = ia.clipped_union(IntervalChunks.join(idx.all_by_cat.get(c) for c in TRAINING_CATEGORIES), lo, hi)
    both = iv.length(iv.intersect(gen, train))
    g, t = iv.length(gen), iv.length(train)
    return {
        "generation_only_ns": g - both,
        "training_only_ns": t - both,
        "both_ns": both,
        "neither_ns": (hi - lo) - (g + t - both),
    }


def stragglers(idx: StageIndex, windows: list[Window]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for w in windows:
        for (role, stage), lanes in idx.by_who_name.items():
            cat = classify(stage)
            if cat == STEP:
                continue
            times = {lane: ia.covered(ints, w.start_ns, w.end_ns) for lane, ints in lanes.items()}
            times = {lane: t for lane, t in times.items() if t > 0}
            if len(times) < 2:
                continue
            slowest = max(sorted(times, key=natural), key=lambda lane: times[lane])
            median = statistics.median(times.values())
            median = int(median) if float(median).is_integer() else median
            lag = times[slowest] - median
            out.append(
                {
                    "step": w.step,
                    "role": role,
                    "stage": stage,
                    "category": cat,
                    "lanes": len(times),
                    "slowest_lane": slowest,
                    "slowest_ns": times[slowest],
                    "median_ns": median,
                    "lag_ns": lag,
                    "lag_pct": round(100.0 * lag / median, 2) if median else None,
                }
            )
    out.sort(key=lambda r: (-r["lag_ns"], r["step"] if r["step"] is not None else -1, r["role"], r["stage"]))
    return out


def _step_of(windows: list[Window], ts_ns: int) -> int | None:
    for w in windows:
        if w.start_ns <= ts_ns < w.end_ns:
            return w.step
    return None


def _step_before(windows: list[Window], ts_ns: int) -> int | None:
    """The step whose window ended last before ``ts_ns``, if no window started since."""
    ended = [w for w in windows if w.end_ns <= ts_ns]
    if not ended:
        return None
    last = max(ended, key=lambda w: w.end_ns)
    return None if any(last.end_ns <= w.start_ns <= ts_ns for w in windows if w is not last) else last.step


def longest_spans(data: TraceData, windows: list[Window]) -> list[dict[str, Any]]:
    out = []
    for s in data.longest[:LONGEST_SHOWN]:
        out.append(
            {
                "name": s.name,
                "category": classify(s.name),
                "cat": s.cat,
                "process": data.process_names.get(s.pid, str(s.pid)),
                "thread": data.thread_names.get((s.pid, s.tid), str(s.tid)),
                "step": _step_of(windows, s.start_ns),
                "start_ns": s.start_ns,
                "dur_ns": s.dur_ns,
            }
        )
    return out


def metrics(
    data: TraceData, windows: list[Window], drivers: frozenset[Any] = frozenset()
) -> list[dict[str, Any]]:
    """Scalar metrics (counter events) per step: mean, last, min, max, count over all processes.

    The step is the sample's ``step`` label when it has one, else the step window it falls in; a
    sample of a process that marks the steps (``drivers``), logged between two windows, is the
    earlier step's: VERL's trainer logs a step's metrics right after the step ends, and its
    RL-Insight logger drops the step number.
    """
    per: dict[str, dict[int | None, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for c in data.counters:
        if c.cat.startswith(METRICS_CAT):  # sampled engine/GPU/host tracks: the telemetry section
            continue
        step = as_int(c.labels.get("step"))  # the step the process said, when it did
        if step is None:
            step = _step_of(windows, c.ts_ns) if windows else None
            if step is None and c.pid in drivers:
                step = _step_before(windows, c.ts_ns)
            if windows and step is None:
                continue
        per[c.name][step].append((c.ts_ns, c.value))
    out = []
    for name in sorted(per)[:MAX_METRICS]:
        rows = []
        for step, samples in sorted(per[name].items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            values = [v for _, v in samples]
            rows.append(
                {
                    "step": step,
                    "mean": statistics.fmean(values),
                    "last": max(samples, key=lambda tv: tv[0])[1],
                    "min": min(values),
                    "max": max(values),
                    "count": len(values),
                }
            )
        out.append({"name": name, "steps": rows})
    return out


def gantt(idx: StageIndex, windows: list[Window]) -> dict[str, Any] | None:
    """Every lane's spans in one step: the profiled one, else the slowest."""
    if not windows:
        return None
    profiled = [w for w in windows if w.profiled]
    w = profiled[0] if profiled else max(windows, key=lambda x: (x.end_ns - x.start_ns, -(x.step or 0)))
    lanes = []
    for who in idx.whos:
        inside = sorted(
            (s for s in idx.spans_of[who] if s.start_ns < w.end_ns and s.end_ns > w.start_ns),
            key=lambda s: s.start_ns,
        )
        spans = []
        for s in inside[:GANTT_SPANS_PER_LANE]:
            start, end = max(s.start_ns, w.start_ns), min(s.end_ns, w.end_ns)
            spans.append([start - w.start_ns, end - start, s.name, classify(s.name)])
        if spans:
            lanes.append(
                {
                    "role": who.role,
                    "lane": who.lane,
                    "spans": spans,
                    "truncated": len(inside) > GANTT_SPANS_PER_LANE,
                }
            )
    return {"step": w.step, "start_ns": w.start_ns, "end_ns": w.end_ns, "lanes": lanes}


def _stage_spans(data: TraceData) -> tuple[Sequence[Span], str]:
    """RL-Insight's spans when the trace has any; else the spans that carry nemo-lens's ``rl.bucket``
    (NeMo-RL's OTLP spans) and the step markers; else the spans :func:`.stages.guessable` lets stand
    for stages and steps (``names``), or none at all (``none``)."""
    tagged = select(data.spans, lambda s: s.cat.startswith(STAGE_CATS) or "state_lane_id" in s.args)
    if tagged:
        return tagged, "rl_insight"
    bucketed = select(data.spans, lambda s: s.args.get(BUCKET_KEY) in RL_BUCKETS or classify(s.name) == STEP)
    if any(s.args.get(BUCKET_KEY) in RL_BUCKETS for s in bucketed):
        return bucketed, "rl_bucket"
    guessed = select(
        data.spans, lambda s: not s.cat.startswith(ROLLOUT_CATEGORY_PREFIX) and guessable(s.name, s.cat)
    )
    return guessed, "names" if any(classify(s.name) != STEP for s in guessed) else "none"


def _guesses(data: TraceData, spans: Sequence[Span], source: str) -> dict[str, Any] | None:
    """What a trace without RL-Insight spans was read as: the names taken, and those refused."""
    if source in ("rl_insight", "rl_bucket"):
        return None
    taken = sorted({s.name for s in spans})
    refused = sorted({s.name for s in data.spans if s.name not in taken and classify(s.name) != "other"})
    return {
        "names": {n: classify(n) for n in taken[:MAX_METRICS]},
        "refused": refused[:20],
        "refused_total": len(refused),
    }


def _steps_from(markers: list[Span], source: str) -> str | None:
    if source == "rl_insight" or not markers:
        return None
    best = min(markers, key=lambda m: marker_priority(m.name) or 0)
    return "ProfilerStep#N" if marker_number(best.name) is not None else best.name


@dataclass
class Model:
    """What every report figure (and ``rl-trace sql``'s report tables) is computed from."""

    spans: Sequence[Span]  # a list, or a :class:`.span_table.SpanTable` (from span shards)
    source: str
    markers: list[Span]
    work: Sequence[Span]
    windows: list[Window]
    idx: StageIndex
    gpu: gpu_section.GpuResult


def model(data: TraceData) -> Model:
    spans, source = _stage_spans(data)
    markers = list(select(spans, lambda s: classify(s.name) == STEP))
    work = select(spans, lambda s: classify(s.name) != STEP)
    if source == "rl_insight" and not select(work, lambda s: classify(s.name) in ROLLOUT_CATEGORIES):
        extra = replica_generation(data)  # separate_async: the replicas generate beside the steps
        if extra:
            work = work.plus(extra) if isinstance(work, SpanTable) else [*work, *extra]
    windows = step_windows(markers)
    if not windows and work:
        windows = [Window(None, min(s.start_ns for s in work), max(s.end_ns for s in work))]
    gpu = gpu_section.analyze(
        data.gpu,
        [(w.step, w.start_ns, w.end_ns) for w in windows],
        # only kernels look stages up (gpu.attribute): a run without Kineto/Proton builds none of them
        [StageSpan(s.pid, s.start_ns, s.end_ns, classify(s.name), s.name) for s in work]
        if len(data.gpu)
        else [],
        process_windows(markers, windows),
        who=lambda pid: process_identity(data, pid),
        process_names=data.process_names,
        merged=bool(data.metadata.get("rl_trace_observer")) or data.mode == "shards",
    )
    return Model(spans, source, markers, work, windows, StageIndex(data, work), gpu)


def build_summary(
    data: TraceData,
    *,
    clock: dict[str, Any] | None = None,
    artifacts: dict[str, Any] | None = None,
    only_steps: Collection[int | None] | None = None,
) -> dict[str, Any]:
    """The whole report as a JSON-ready dict (schema :data:`SCHEMA`).

    ``only_steps``: compute the per-step sections (steps, answers, stragglers, telemetry, ...) for
    these steps' windows only — the watch's piece holds the step before too, whose rows it drops.
    Each of those sections is a loop over windows that never reads another window, so the rows of
    the steps kept are the same as in the whole report; the rollout section still sees every window
    (a weight sync between two steps belongs to the next: it needs the one before)."""
    m = model(data)
    spans, source, markers, work, windows, idx = m.spans, m.source, m.markers, m.work, m.windows, m.idx
    every = windows
    if only_steps is not None:
        windows = [w for w in windows if w.step in only_steps]
    steps = []
    for w in windows:
        ranks = _rank_rows(idx, w)
        steps.append(
            {
                "step": w.step,
                "start_ns": w.start_ns,
                "end_ns": w.end_ns,
                "dur_ns": w.end_ns - w.start_ns,
                "profiled": w.profiled,
                "mode": w.mode,
                "ranks": ranks,
                "roles": _role_rows(ranks),
                "overlap": overlap(idx, w.start_ns, w.end_ns),
            }
        )
    run_overlap = overlap(idx, windows[0].start_ns, windows[-1].end_ns) if windows else None
    rows, answer_windows = work_spans(idx), [StepWindow(w.step, w.start_ns, w.end_ns) for w in windows]
    answers = answer_sections(rows, answer_windows, lanes_of(idx))
    # every window: a driver's sample logged between two steps is the earlier step's
    metric_rows = metrics(data, every, frozenset(s.pid for s in markers))
    answers["metric_check"] = metric_check(rows, answer_windows, metric_rows, answers["goodput"])
    rollout = rollout_section(
        select(data.spans, lambda s: s.cat.startswith(ROLLOUT_CATEGORY_PREFIX)),  # per shape
        [(w.step, w.start_ns, w.end_ns) for w in every],
        {
            c: ints for c, ints in idx.all_by_cat.items() if c not in ROLLOUT_CATEGORIES
        },  # the work's, by category
    )
    gpu = gpu_section.section(m.gpu, data.gpu.untracked)
    if gpu is not None:
        gpu["idle_while"] = gpu_answers(rows, m.gpu.windows, m.gpu, answers["critical_path"])
    return {
        "schema": SCHEMA,
        "source": {
            "path": data.path,
            "events": data.events - data.names,  # what the merge summary says: names are no events
            "spans_seen": data.spans_seen,
            "stage_spans": len(work),
            "step_markers": len(markers),
            "stage_source": source,
            "guessed": _guesses(data, spans, source),
            "steps_from": _steps_from(markers, source),
            "loader": data.mode,
            "unmatched_ends": data.unmatched_ends,
            "dropped_events": data.dropped,
        },
        "stage_table": [{"category": r.category, "pattern": r.pattern} for r in STAGE_TABLE],
        "categories": list(CATEGORIES),
        "steps": steps,
        "overlap": run_overlap,
        "stragglers": stragglers(idx, windows),
        "longest_spans": longest_spans(data, windows),
        "metrics": metric_rows,
        "gantt": gantt(idx, windows),
        "clock": clock,
        "artifacts": artifacts,
        "rollout": rollout,
        "telemetry": telemetry_section(
            data.counters,
            data.process_names,
            answer_windows,
            rows,
            rollout,
            (artifacts or {}).get("metrics") or [],
        ),
        **answers,
        "gpu": gpu,
    }
