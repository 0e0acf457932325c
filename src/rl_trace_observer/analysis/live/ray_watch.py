"""``rl-trace watch --ray``: a run whose files lie on the disks of a Ray cluster's nodes, followed
where they are.

The nodes and their output directories are found as ``rl-trace collect`` and ``merge --ray`` find
them (``integrations.ray.collect.survey``: the same overrides, a shared filesystem read once, the
same node labels), once at the start and again whenever the set of alive nodes changes. Each look
runs one small task pinned to each node (``on_each_node`` → :func:`.node_follow.follow_node`) with
the offsets the driver keeps for that node; the node reads only its appended bytes and returns only
small facts (offsets, step markers, the latest event time, bad lines, skippable byte runs). The
driver's step rule is the local watch's (:class:`.watch.Watch`), over every node's markers.

A finished step is merged by ``WatchOptions.merge`` — the merge's Ray executor
(``cluster.ray_merge``, given by the command line: this package may not import ``cluster``) — cut to
the step's padded window, so the step is converted next to its data on each node and only its piece
of span shards and its view travel. The state file keeps per-node offsets and facts, keyed by node
label: a watch started again resumes without reading old bytes again. A node that dies or stops
answering is named (``status()["nodes"]``, ``errors``); the other nodes' steps are still answered.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...merge.options import UsageError
from .follow import FileMark
from .node_follow import fold, follow_node
from .seen import Seen
from .watch import Watch, load_state

RUN_ID = "watch"  # the survey's run only filters which files a copy would take; the watch takes all


@dataclass
class NodesOptions:
    """How the cluster is reached (``merge --ray``'s options of the same names)."""

    address: str | None = None  # default: join the running cluster ("auto")
    output_dir: str | None = None  # read on every node (default: RL_TRACE_OUTPUT_DIR)
    node_output_dirs: dict[str, str] = field(default_factory=dict)  # per node: id, resource or IP
    timeout_s: float = 60.0  # a node that does not answer a look in this long is named


@dataclass
class _Node:
    label: str
    node_id: str
    root: str  # its output directory, as the node resolved it
    surveyed: Any  # the survey's ``SurveyedNode``: what ``on_each_node`` pins a look to


@dataclass
class RayWatch(Watch):
    nodes_opts: NodesOptions = field(default_factory=NodesOptions)
    node_marks: dict[str, dict[str, FileMark]] = field(init=False)
    node_seen: dict[str, Seen] = field(init=False)
    node_state: dict[str, dict[str, Any]] = field(init=False)
    follow_bytes: int = field(init=False, default=0)  # what the looks' answers carried to the driver
    _nodes: list[_Node] = field(init=False, default_factory=list)
    _alive: frozenset[str] = field(init=False, default=frozenset())
    _ray: Any = field(init=False, default=None)
    _joined: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        state = load_state(self.opts.out_dir.resolve())
        if state and "nodes" not in state:
            raise UsageError(f"{self.opts.out_dir}: a local watch's state (no --ray); choose another --out")
        nodes = state.get("nodes", {})
        self.node_marks = {
            str(label): {k: FileMark.from_json(v) for k, v in d.get("files", {}).items()}
            for label, d in nodes.items()
        }
        self.node_seen = {str(label): Seen.from_json(d.get("seen", {})) for label, d in nodes.items()}
        self.node_state = {}
        self.steps = {int(k): v for k, v in state.get("steps", {}).items()}
        self.errors = {}
        self.seen = self._all_seen()
        try:
            import ray
        except ImportError:
            raise UsageError("--ray needs Ray: pip install 'rl-trace-observer[ray]'") from None
        from ...integrations.ray.collect import connect

        self._ray = ray
        self._joined = connect(ray, self.nodes_opts.address)
        self._survey()

    def close(self) -> None:
        """Let go of the cluster if this watch joined it."""
        if self._joined:
            self._ray.shutdown()
            self._joined = False

    # ------------------------------------------------------------------------------ the nodes
    def _survey(self) -> None:
        from ...integrations.ray.collect import survey

        o = self.nodes_opts
        sv = survey(self._ray, o.output_dir, dict(o.node_output_dirs), RUN_ID, lambda _run: [], o.timeout_s)
        self._alive = frozenset(n.report.node_id for n in sv.nodes)
        self._nodes = []
        for n in sv.leaders:
            rep = n.report
            if n.listing is None or not rep.output_dir:
                self.node_state[rep.label or rep.node_id[:12]] = {
                    "status": rep.status,
                    "node_id": rep.node_id,
                    "error": "; ".join(rep.notes) or "did not answer the survey",
                }
                continue
            self._nodes.append(_Node(rep.label, rep.node_id, str(rep.output_dir), n))

    def _poll(self) -> bool:
        from ...integrations.ray.collect import on_each_node

        ray = self._ray
        alive = frozenset(i["NodeID"] for i in ray.nodes() if i.get("Alive"))
        if alive != self._alive:  # a node joined, left or came back: find the nodes again
            self._survey()
        by_id = {n.node_id: n for n in self._nodes}
        todo = [n.surveyed for n in self._nodes if n.node_id in alive]
        profiles = not any(s.logs for s in self.node_seen.values())  # no event log on any node yet

        def args(sn: Any) -> tuple[Any, ...]:
            node = by_id[sn.report.node_id]
            marks = {k: m.to_json() for k, m in self.node_marks.get(node.label, {}).items()}
            waiting = self.node_seen[node.label].waiting if node.label in self.node_seen else {}
            return node.root, marks, waiting, profiles

        got = on_each_node(ray, follow_node, todo, args, self.nodes_opts.timeout_s)
        moved = False
        for node in self._nodes:
            answer = got.get(node.node_id)
            before = self.node_state.get(node.label, {}).get("status")
            if node.node_id not in alive:
                answer = RuntimeError("the node left the cluster")
            if isinstance(answer, BaseException) or answer is None:
                last = (str(answer).strip().splitlines() or [""])[-1]
                self.node_state[node.label] = {
                    "status": "lost",
                    "node_id": node.node_id,
                    "root": node.root,
                    "error": f"{type(answer).__name__}: {last}",
                }
                moved = moved or before != "lost"
                continue
            self.follow_bytes += len(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
            self.node_marks[node.label] = {k: FileMark.from_json(v) for k, v in answer["marks"].items()}
            known = self.node_seen.setdefault(node.label, Seen())
            moved = fold(known, answer) or moved
            self.node_state[node.label] = {
                "status": "ok" if answer["exists"] else "empty",
                "node_id": node.node_id,
                "root": answer["root"],
                "host": answer["host"],
            }
            moved = moved or before != self.node_state[node.label]["status"]
        self._lost_labels(alive)
        if moved:
            self.seen = self._all_seen()
        return moved

    def _lost_labels(self, alive: frozenset[str]) -> None:
        """Nodes whose files this watch read before and that are gone from the cluster now."""
        present = {n.label for n in self._nodes}
        for label in self.node_marks:
            if label not in present and self.node_state.get(label, {}).get("status") != "lost":
                self.node_state[label] = {"status": "lost", "error": "the node is no longer in the cluster"}
                self.version += 1

    def _all_seen(self) -> Seen:
        """Every node's facts as one: markers of all nodes count for the step rule; files named
        ``<node label>/<path>``."""
        out = Seen()
        for label in sorted(self.node_seen):
            s = self.node_seen[label]
            out.markers += s.markers
            out.logs = out.logs or s.logs
            out.profiled.update({f"{label}/{rel}": ms for rel, ms in s.profiled.items()})
            out.lines += s.lines
            out.last_ts_ns = max(out.last_ts_ns, s.last_ts_ns)
            out.bad.update({f"{label}/{rel}": e for rel, e in s.bad.items()})
        return out

    # ----------------------------------------------------------------------- the Watch's hooks
    def _skip_lines(self, before_ns: int) -> dict[str, tuple[tuple[int, int], ...]]:
        out: dict[str, tuple[tuple[int, int], ...]] = {}
        for label, s in self.node_seen.items():
            out.update(s.skip_lines(Path("/"), before_ns, prefix=f"/{label}/"))  # a Ray merge's source path
        return out

    def _files(self) -> int:
        return sum(len(m) for m in self.node_marks.values())

    def _known(self) -> tuple[Any, ...]:
        nodes = tuple((label, d.get("status")) for label, d in sorted(self.node_state.items()))
        return (*super()._known(), nodes)

    def _where(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.opts.run_dir),
            "nodes": {
                label: {
                    "files": {k: m.to_json() for k, m in self.node_marks.get(label, {}).items()},
                    "seen": s.to_json(),
                }
                for label, s in sorted(self.node_seen.items())
            },
        }

    def status(self) -> dict[str, Any]:
        out = super().status()
        out["nodes"] = {label: dict(d) for label, d in sorted(self.node_state.items())}
        out["errors"] = sorted(
            out["errors"]
            + [
                f"node {label}: {d['status']}: {d['error']}"
                for label, d in out["nodes"].items()
                if d.get("error")
            ]
        )
        out["follow_bytes"] = self.follow_bytes
        return out
