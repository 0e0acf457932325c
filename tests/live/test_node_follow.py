"""``watch --ray``'s node side without a cluster: a node's look (:func:`follow_node`) folded into the
driver's facts (:func:`fold`) learns exactly what the local watch's follower learns from the same
bytes, however the looks fall, and reads every line once."""

from __future__ import annotations

from pathlib import Path

from rl_trace_observer.analysis.live.follow import Follower
from rl_trace_observer.analysis.live.node_follow import fold, follow_node
from rl_trace_observer.analysis.live.seen import Seen

from ..corpus.live_run import LiveRun


def test_node_looks_folded_equal_the_local_follower(tmp_path: Path) -> None:
    run = LiveRun(tmp_path / "run")
    run.add_sampler()
    local, local_follow = Seen(), Follower(run.folder)
    known: Seen = Seen()
    marks: dict[str, dict[str, int]] = {}
    try:
        for step in (1, 2, 3):
            run.step(step)
            if step == 2:
                log = next(p for p in run.folder.iterdir() if "7003" in p.name and p.suffix == ".jsonl")
                with log.open("ab") as f:
                    f.write(b"not json\n")
            local_follow.poll(local.line)
            got = follow_node(str(run.folder), marks, known.waiting)
            assert got["exists"]
            fold(known, got)
            marks = got["marks"]
        again = follow_node(str(run.folder), marks, known.waiting)  # nothing new: nothing read
        assert not fold(known, again)
    finally:
        run.close()
    assert known.windows() == local.windows() and [w.step for w in known.windows()] == [1, 2, 3]
    assert (known.lines, known.last_ts_ns, known.bad) == (local.lines, local.last_ts_ns, local.bad)
    assert known.bad_total == 1
    before = 2**62  # every line old: the runs the nodes' looks found join into the local ones
    assert known.skip_lines(Path("/"), before, prefix="/n/") == {
        f"/n/{Path(k).relative_to(run.folder.resolve())}": v
        for k, v in local.skip_lines(run.folder, before).items()
    }
    assert follow_node(str(tmp_path / "none"), {}, {})["exists"] is False
