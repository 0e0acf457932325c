"""``merge(inputs, output, options) -> MergeResult``: the merge on this machine, as a library call.

The executor here (:class:`LocalPool`) plans from files it can open and runs the jobs in worker
processes. Why processes, and why this shape: parsing is CPU-bound Python, so the GIL rules out
threads; each job parses, rewrites and serialises (and, for ``.json.gz``, deflates) its file inside
the worker, so the parent only concatenates bytes. Results are consumed in job order with a bounded
window, sized by an estimate of each file's decompressed bytes, so memory never grows with the
number or total size of the inputs — at most a couple of files' events are alive at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

from ..files.sources import InputError, Source, decompressed_size, discover
from ..job import run_job
from ..job.pool import BoundedPool, start_method
from ..job.spec import Job, JobResult
from ..job.stitch import RunState, Stitcher
from ..manifest.document import manifest_path_for
from ..options import MergeOptions, MergeResult, UsageError, default_workers, output_format, step_output
from ..output import spill
from ..plan.build import plan_sources
from ..shards.layout import is_shards_dir
from .orchestrate import Inventory, Located, run_merge

__all__ = ["LocalPool", "merge", "merge_steps"]

INLINE_BYTES = 24 << 20  # below this much input, worker start-up costs more than it saves


def merge(inputs: list[str], output: str, options: MergeOptions | None = None) -> MergeResult:
    """Merge files, directories (recursively) or fsspec URLs into ``output`` (``.pftrace[.gz]``,
    ``.json[.gz]``); a span shard directory as the one input writes a view of it instead."""
    opts = options or MergeOptions()
    if len(inputs) == 1 and is_shards_dir(inputs[0]):  # a view: written from the rows, not the inputs
        if output.endswith(".tar"):
            from ..views.archive import merge_archive

            return merge_archive(inputs[0], output, opts)
        from ..views.view import merge_view

        return merge_view(inputs[0], output, opts)
    return run_merge(LocalPool(inputs), output, opts)


class LocalPool:
    """The inputs as this machine sees them; the jobs in a pool of worker processes (``workers``)."""

    def __init__(self, inputs: list[str]) -> None:
        self.inputs = inputs
        self.sources: list[Source] = []
        self.earlier_outputs: list[str] = []
        self.opts = MergeOptions()

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def locate(self, output: str, opts: MergeOptions) -> Located:
        out = Path(output)
        manifest_path = Path(opts.manifest) if opts.manifest else manifest_path_for(output)
        try:
            self.sources = discover(self.inputs)
        except InputError as exc:
            raise UsageError(str(exc)) from exc
        own = (out.resolve(), manifest_path.resolve())
        self.sources, self.earlier_outputs = _without_own_outputs(self.sources, self.inputs, own, output)
        self.opts = opts
        return Located(out, opts, [str(i) for i in self.inputs], options_dict(opts))

    def inventory(self) -> Inventory:
        return Inventory(self.sources, ignored=self.earlier_outputs)

    def estimate(self, src: Source) -> int:
        return decompressed_size(src)

    def run(self, jobs: list[Job], stitch: Stitcher, problems: list[Any]) -> RunState:
        opts, out = self.opts, stitch.out
        for job in jobs:  # outputs come back through part files, not the pipe (see ..output.spill)
            job.spill_path = spill.part_path(out, job.sequence_id)
        workers = default_workers() if opts.workers is None else opts.workers
        try:
            with stitch.output() as add:
                for res in _results(jobs, workers, opts.workers is None, opts.progress):
                    add(res, res.pieces)
        except BaseException:
            spill.remove_parts(out)
            raise
        return stitch.state

    def report(self, manifest: dict[str, Any], problems: list[Any], failed: bool) -> None:
        return None

    def finished(self, manifest: dict[str, Any], written: bool) -> None:
        return None


def _without_own_outputs(
    sources: list[Source], inputs: list[str], own: tuple[Path, ...], output: str
) -> tuple[list[Source], list[str]]:
    """Merged outputs found in an input directory — this merge's own from its previous run, or any
    file beside its ``<name>.manifest.json`` — are skipped (and listed as ignored); this merge's
    output named as an input itself is a usage error."""
    named = {Path(i).resolve() for i in inputs if "://" not in i}
    manifests = {s.path for s in sources if s.path.endswith(".manifest.json")}
    kept, skipped = [], []
    for src in sources:
        local = src.protocol in ("file", "local") and src.unreadable is None  # a loop cannot resolve
        if local and Path(src.path).resolve() in own:
            if Path(src.path).resolve() in named:
                raise UsageError(f"{output}: is one of the inputs; choose another output path")
            skipped.append(src.url)
        elif f"{src.path}.manifest.json" in manifests:
            skipped.append(src.url)
        else:
            kept.append(src)
    return kept, skipped


def options_dict(opts: MergeOptions) -> dict[str, Any]:
    d = asdict(opts)
    d.pop("progress", None)
    return d


def _results(jobs: list[Job], workers: int, auto: bool, progress: Any) -> Iterator[JobResult]:
    total = sum(j.weight for j in jobs) or 1
    done = 0
    if workers <= 0 or len(jobs) <= 1 or (auto and total < INLINE_BYTES):
        for job in jobs:
            res = run_job(job)
            done += job.weight
            if progress:
                progress(done, total)
            yield res
        return
    pool = BoundedPool(run_job, _weight, workers, start_method("fork"), ordered=True)
    for got in pool.run(jobs):
        assert got is not None  # no heartbeats asked for
        job, res = got
        done += job.weight
        if progress:
            progress(done, total)
        yield res


def _weight(job: Job) -> int:
    return job.weight


def merge_steps(inputs: list[str], output: str, options: MergeOptions | None = None) -> list[MergeResult]:
    """``--split-steps``: one output (and manifest) per step — the selected steps, else every step
    the run recorded a window for."""
    opts = options or MergeOptions()
    output_format(output)
    if len(inputs) == 1 and is_shards_dir(inputs[0]):
        from ..views.view import split_views

        return split_views(inputs[0], output, opts)
    if opts.shards:
        raise UsageError("--shards with --split-steps: write the shards once, then split them into views")
    if opts.steps:
        steps = sorted({s for lo, hi in opts.steps for s in range(lo, hi + 1)})
    else:
        try:
            plan = plan_sources(discover(inputs))
        except InputError as exc:
            raise UsageError(str(exc)) from exc
        steps = sorted(plan.step_windows)
    if not steps:
        raise UsageError("--split-steps: the inputs record no step windows (step_begin/step_end); use --step")
    results = []
    for step in steps:
        one = MergeOptions(**{**opts.__dict__, "steps": ((step, step),), "manifest": None})
        results.append(merge(inputs, step_output(output, step), one))
    return results
