"""Driver side of a node's conversion: consume its generator, land each job's files, keep its result.

One thread per node (Ray's ``ray.get`` releases the GIL while it waits). Memory stays bounded on
both ends: the node yields batches of at most ``chunk`` bytes and Ray holds the generator once
``in_flight`` batches wait, so each side holds a few chunks whatever the node's data size. A node
that sends nothing for ``stall_timeout_s`` is called stalled, one whose task or node dies is lost;
either way the jobs it finished are kept, and the others are named.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..integrations.ray.collect_node import chunk_view
from .node import JobDone, NodeJob
from .store import Landing, Store, StoreError


@dataclass
class NodeRun:
    """How one node's part of the merge went (manifest ``cluster.nodes``)."""

    label: str
    node_id: str
    host: str | None = None
    status: str = "pending"  # ok | lost | stalled | failed | nothing (every job already done)
    jobs: int = 0
    reused: int = 0  # jobs found finished in the store (an earlier run)
    converted: int = 0
    bytes_received: int = 0  # everything that came from the node, of which:
    bytes_pieces: int = 0  # output pieces (compressed for .gz outputs)
    bytes_shards: int = 0  # span shard parts
    raw_bytes: int = 0  # what the node's selected input files hold (what collect would move)
    seconds: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


class Receiver:
    """State machine over a node's messages: job → its files (file → data* → end) → next job."""

    def __init__(self, store: Store, run: NodeRun, results: dict[str, JobDone]) -> None:
        self.store, self.run, self.results = store, run, results
        self.current: JobDone | None = None
        self.waiting: set[str] = set()
        self.landing: Landing | None = None
        self.rel = ""
        self.finished = False

    def handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "data":
            if self.landing is None:
                raise StoreError("node sent data before naming its file")
            view = chunk_view(msg[1])
            self.landing.write(view)
            self.run.bytes_received += view.nbytes
            if self.rel.startswith("shards/"):
                self.run.bytes_shards += view.nbytes
            else:
                self.run.bytes_pieces += view.nbytes
        elif kind == "job":
            self._job(msg[1])
        elif kind == "file":
            rel, size = msg[1], int(msg[2])
            if rel not in self.waiting:
                raise StoreError(f"node sent {rel!r}, which its job did not announce")
            self.abort()
            self.landing, self.rel = Landing(self.store.target(rel), size), rel
        elif kind == "end":
            if self.landing is None or msg[1] != self.rel:
                raise StoreError(f"node ended {msg[1]!r} without sending it")
            landing, self.landing = self.landing, None
            landing.commit(msg[2])
            self.waiting.discard(self.rel)
            self._maybe_done()
        elif kind == "beat":  # a node still working on long jobs
            pass
        elif kind == "done":
            self.run.memory = dict(msg[1])
            self.run.host = self.run.memory.pop("host", None)
            self.finished = True

    def _job(self, done: JobDone) -> None:
        self.run.bytes_received += len(
            pickle.dumps(done, protocol=pickle.HIGHEST_PROTOCOL)
        )  # as it travelled
        if self.waiting:
            raise StoreError(f"node moved on before sending {sorted(self.waiting)}")
        self.current = done
        if done.result is None:  # a rebase or an error: nothing to land
            self.results[done.key] = done
            self.current = None
            return
        self.waiting = {f"{done.key}.piece"} | {f"shards/{p['path']}" for p in done.shards}
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.current is not None and not self.waiting:
            self.store.put(self.current)
            self.results[self.current.key] = self.current
            self.run.converted += 1
            self.current = None

    def abort(self) -> None:
        if self.landing is not None:
            landing, self.landing = self.landing, None
            landing.abort()


class Stalled(RuntimeError):
    """The node sent nothing for ``stall_timeout_s``."""


def gather(
    ray: Any,
    convert_remote: Any,
    run: NodeRun,
    items: list[NodeJob],
    store: Store,
    results: dict[str, JobDone],
    *,
    workers: int,
    chunk: int,
    in_flight: int,
    stall_timeout_s: float,
    one_line: Callable[[BaseException], str],
) -> None:
    """Run one node's jobs and land what they make; every failure ends up in ``run``, nothing raised."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = time.monotonic()
    receiver = Receiver(store, run, results)
    gen = None
    try:
        gen = convert_remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(run.node_id, soft=False),
            _generator_backpressure_num_objects=in_flight,
        ).remote(items, workers, chunk)
        while not receiver.finished:
            ready, _ = ray.wait([gen], timeout=stall_timeout_s)
            if not ready:
                raise Stalled(f"no answer from the node for {stall_timeout_s:g} s")
            try:
                ref = next(gen)
            except StopIteration:
                raise RuntimeError("the node's task ended without its final message") from None
            batch = ray.get(ref)
            del ref
            for msg in batch:
                receiver.handle(msg)
            del batch
        run.status = "ok"
    except Stalled as exc:
        run.status, run.error = "stalled", str(exc)
    except ray.exceptions.RayTaskError as exc:
        run.status, run.error = "failed", one_line(exc)
    except ray.exceptions.RayError as exc:
        run.status, run.error = "lost", f"node lost during the merge ({type(exc).__name__}: {one_line(exc)})"
    except Exception as exc:
        run.status, run.error = "failed", f"{type(exc).__name__}: {one_line(exc)}"
    finally:
        receiver.abort()
        if gen is not None and not receiver.finished:
            try:
                ray.cancel(gen, force=True)
            except Exception:
                pass
        run.seconds = round(time.monotonic() - started, 3)
