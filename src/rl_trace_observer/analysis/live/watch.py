"""``rl-trace watch``: follow a run, and answer each step as it finishes.

One look (:meth:`Watch.look`): read the bytes appended to the run's line files (:mod:`.follow`),
learn step markers and bad lines from them (:mod:`.seen`), and for every step the project's step
rule says has FINISHED (its marker was read at least ``settle_s`` ago — the other processes' last
lines of that step are flushed by then; a quiet-files rule would never fire beside a metric sampler
that writes every second) and that is not answered yet, in step order:

1. merge that step's window (± ``pad_s``, reaching back to the previous step's end so what ran
   between the two, a weight sync, is in it: :func:`.answer.answer_step`) into a new piece of span
   shards (``pieces/step-N``) and that step's Perfetto view (``views/step-N.pftrace``) — one call of
   the merge's public entry point with ``MergeOptions(time_window=..., shards=...)``, so the step is
   aligned with the clock data the run holds at that moment; earlier pieces are never rewritten;
2. compute the report over that piece and keep the step's rows (:mod:`.figures`) in
   ``steps/step-N.json``;
3. record the step as answered in the state file.

The state (offsets, markers seen, bad lines, answered steps) is written atomically after each step
and after each look that learnt something the status shows (a marker, a bad line, a new file, the
run going past its last step); mere progress (offsets, line counts, the latest event's time) is
written and published at most every :data:`PROGRESS_S` — between steps, with every file growing,
a state write and a page rebuild every look were most of the watch's CPU. A watch killed at any
point and started again resumes from a state whose offsets and facts belong together: a step whose
record was not yet written is answered again (its files are rewritten whole, atomically), a step
recorded is never answered twice, and no line is counted twice (at most the last ``PROGRESS_S`` of
bytes are read again).

Clock data that arrives later (a later ``clock_sync``, another host's offsets): each step records
the clock correction its merge used (:func:`clock_key`); when a later step's merge uses a different
one, the earlier steps are merged again into a new revision of their piece and marked
``corrected`` (the figures shown before are kept beside as ``previous``), so the watch never stays
silently different from the post-hoc answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...common.atomic import write_atomic
from ...common.encoding import dumps_pretty
from ...merge.options import UsageError
from .anchors import RecordAnchors
from .follow import FileMark, Follower
from .options import WatchOptions
from .profiler_markers import look_at_profiles
from .seen import Seen

STATE_NAME = "watch-state.json"
STATE_SCHEMA = "rl-trace-watch/1"
STEPS_DIR = "steps"
RETRY_S = 10.0  # a step whose merge failed is tried again after this long (the files may still move)
PROGRESS_S = 1.0  # progress alone (offsets, line counts) is saved and published at most this often


@dataclass
class Watch:
    opts: WatchOptions
    clock: Callable[[], float] = time.monotonic
    follower: Follower = field(init=False)
    seen: Seen = field(init=False)
    anchors: RecordAnchors = field(init=False)
    steps: dict[int, dict[str, Any]] = field(init=False)
    errors: dict[int, str] = field(init=False)
    _first_seen: dict[int, float] = field(init=False, default_factory=dict)  # step -> its marker read
    _retry_at: dict[int, float] = field(init=False, default_factory=dict)  # a failed step: not before
    version: int = field(init=False, default=0)  # moves whenever what :meth:`status` says may change
    _saved_version: int = field(init=False, default=-1)
    _behind: bool = field(init=False, default=False)  # read since the last save: progress not yet shown
    _saved_at: float = field(init=False, default=float("-inf"))
    _known_then: tuple[Any, ...] = field(init=False, default=())  # :meth:`_known` at the last save
    _answers: int = field(init=False, default=0)  # steps answered (or re-answered) so far
    _rechecked: int = field(init=False, default=-1)  # ``_answers`` when the clock was last rechecked

    def __post_init__(self) -> None:
        run, out = self.opts.run_dir.resolve(), self.opts.out_dir.resolve()
        if not run.is_dir():
            raise UsageError(f"{self.opts.run_dir}: not a directory (the run's output directory)")
        if out == run or run in out.parents:
            raise UsageError(f"{self.opts.out_dir}: inside the run directory; choose --out elsewhere")
        state = load_state(out)
        if "nodes" in state:
            raise UsageError(f"{self.opts.out_dir}: a Ray watch's state (--ray); choose another --out")
        marks = {k: FileMark.from_json(v) for k, v in state.get("files", {}).items()}
        self.follower = Follower(run, marks)
        self.anchors = RecordAnchors(run)
        self.seen = Seen.from_json(state.get("seen", {}))
        self.steps = {int(k): v for k, v in state.get("steps", {}).items()}
        self.errors = {}

    # ----------------------------------------------------------------------------------- looking
    def look(self, final: bool = False) -> list[int]:
        """Read what is new and answer every finished step; returns the steps answered now.
        ``final``: the files are complete (``--once``, the end of a run): no settle time."""
        if self._poll():
            self._behind = True
        now = self.clock()
        if self._behind and (
            final or now - self._saved_at >= PROGRESS_S or self._known() != self._known_then
        ):
            self.version += 1
        answered = []
        since: int | None = None  # the previous step's end: a step's merge reaches back to it
        for window in self.seen.windows():
            before, since = since, window.end_ns if since is None else max(since, window.end_ns)
            if window.step in self.steps:
                continue
            first_seen = self._first_seen.setdefault(window.step, now)
            if not final and (
                now - first_seen < self.opts.settle_s or now < self._retry_at.get(window.step, 0)
            ):
                continue
            if self._answer(window.step, window.start_ns, window.end_ns, extra={"since_ns": before}):
                answered.append(window.step)
        self._recheck_clock()
        if self.version != self._saved_version:  # an idle look writes nothing
            self.save()
        return answered

    def _known(self) -> tuple[Any, ...]:
        """What the status says beyond progress: a change is saved and published at once."""
        seen = self.seen
        ends = max((w.end_ns for w in seen.windows()), default=0)
        return (len(seen.markers), seen.bad_total, len(seen.waiting), self._files(), seen.last_ts_ns > ends)

    def _poll(self) -> bool:
        """Read what is new (the run's files here; a Ray watch asks its nodes); True if anything moved."""
        changed = self.follower.poll(self.seen.line)
        moved = bool(changed)
        if self.seen.waiting and self.seen.place(self.anchors.look()):  # AReaL: steps once anchored
            moved = True
        if not self.seen.logs and look_at_profiles(self.seen, str(self.opts.run_dir), changed):
            moved = True  # a run without event logs: its profilers' step markers
        return moved

    def _skip_lines(self, before_ns: int) -> dict[str, tuple[tuple[int, int], ...]]:
        """What a step's merge may leave unread (``MergeOptions.skip_lines``, keyed as its sources)."""
        return self.seen.skip_lines(self.opts.run_dir, before_ns)

    def _answer(
        self, step: int, start_ns: int, end_ns: int, revision: int = 1, extra: dict[str, Any] | None = None
    ) -> bool:
        from .answer import answer_step, merge_from, skip_before

        latest = self.steps[max(self.steps)].get("clock_key") if self.steps else None
        lo = merge_from(start_ns, (extra or {}).get("since_ns"))
        skip = self._skip_lines(skip_before(lo, self.opts.pad_s, latest))
        try:
            record = answer_step(self.opts, step, (lo, end_ns), revision, skip)
        except Exception as exc:  # a step that cannot be merged now: named, tried again next look
            self.errors[step] = f"step {step}: {type(exc).__name__}: {exc}"
            self._retry_at[step] = self.clock() + RETRY_S
            self.version += 1
            self._say(self.errors[step])
            return False
        self.errors.pop(step, None)
        self._retry_at.pop(step, None)
        record.update({"start_ns": start_ns, "end_ns": end_ns, "revision": revision, **(extra or {})})
        (self.opts.out_dir / STEPS_DIR).mkdir(parents=True, exist_ok=True)
        write_atomic(self.opts.out_dir / STEPS_DIR / f"step-{step}.json", dumps_pretty(record))
        self.steps[step] = record
        self._answers += 1
        self.version += 1
        self.save()
        self._say(f"step {step}: answered in {record['answer_s']:.2f} s ({record['events']} events)")
        return True

    def _recheck_clock(self) -> None:
        """Re-answer the steps whose merge used an older clock correction or other process identities
        (roles, ranks: a process record rewritten later) than the latest step's."""
        from .answer import stale

        if not self.steps or (self._rechecked == self._answers and not self.errors):
            return  # the latest step's clock data is unchanged since the last check, and nothing failed
        self._rechecked = self._answers
        latest = self.steps[max(self.steps)]
        for step, rec in sorted(self.steps.items()):
            if not stale(rec, latest):
                continue
            shown = {
                "figures": rec["figures"],
                "clock_key": rec.get("clock_key"),
                "identity": rec.get("identity"),
                "revision": rec.get("revision"),
            }
            extra = {
                "corrected": True,
                "previous": rec.get("previous", shown),  # the first shown stays
                "since_ns": rec.get("since_ns"),
            }
            self._answer(step, rec["start_ns"], rec["end_ns"], int(rec.get("revision", 1)) + 1, extra)

    def close(self) -> None:
        """Close the run's files the follower keeps open between looks."""
        self.follower.close()

    # ------------------------------------------------------------------------------ what it knows
    def status(self) -> dict[str, Any]:
        """Everything the server shows: answered steps, steps still open, bad lines."""
        windows = self.seen.windows()
        done_end = max((w.end_ns for w in windows if w.step in self.steps), default=0)
        last_step = max(self.steps, default=None)
        unfinished = None
        if self.seen.last_ts_ns > max((w.end_ns for w in windows), default=0):
            unfinished = {"after_step": last_step, "last_event_ns": self.seen.last_ts_ns}
        return {
            "run_dir": str(self.opts.run_dir),
            "steps": [self.steps[s] for s in sorted(self.steps)],
            "pending": [w.step for w in windows if w.step not in self.steps],
            "unfinished": unfinished,
            "answered_through_ns": done_end,
            "bad_lines": {"total": self.seen.bad_total, "files": self.seen.bad},
            "errors": sorted(self.errors.values()),
            "files": self._files(),
            "lines": self.seen.lines,
        }

    def _files(self) -> int:
        return len(self.follower.marks)

    def _where(self) -> dict[str, Any]:
        """What the state file holds of the reading: the offsets and what was learnt."""
        return {
            "run_dir": str(self.opts.run_dir.resolve()),
            "files": {k: m.to_json() for k, m in self.follower.marks.items()},
            "seen": self.seen.to_json(),
        }

    def save(self) -> None:
        state = {
            "schema": STATE_SCHEMA,
            **self._where(),
            "steps": {str(k): v for k, v in sorted(self.steps.items())},
        }
        self.opts.out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.opts.out_dir / STATE_NAME, orjson.dumps(state))
        self._saved_version = self.version
        self._behind, self._saved_at, self._known_then = False, self.clock(), self._known()

    def _say(self, line: str) -> None:
        if self.opts.log is not None:
            self.opts.log(line)


def load_state(out: Path) -> dict[str, Any]:
    """The state a previous watch left in ``out`` ({} when none); another version's is an error."""
    try:
        state = orjson.loads((out / STATE_NAME).read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UsageError(f"{out / STATE_NAME}: unreadable ({exc}); remove it to start over") from None
    if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
        raise UsageError(f"{out / STATE_NAME}: not a {STATE_SCHEMA} state file; choose another --out")
    return state
