"""Added cost per rollout request of the request capture, against the agent loop without it.

The loop is VERL 0.9.1's own ``LLMServerClient.generate`` (load-balancer round trip, fresh request
id, the call to the server) calling a rollout server in process whose engine streams vLLM-shaped
``RequestOutput``s (``--yields`` per request, with ``RequestStateStats`` metrics) and does no
other work: a stand-in for the GPU engine and for Ray's transport (``.remote`` returns an
awaitable), so what is measured is Python per request, the part our hooks add to. Modes, in
alternating rounds of one process so that both see the same machine:

- ``baseline``: no hooks, capture off;
- ``client`` / ``server``: capture on, only that side's hook installed;
- ``hooks``: both — two spans per request (client in the agent loop, server in the replica, with
  the engine's phase times and the engine tap);
- ``api``: the capture API alone, ``begin/end_client`` + ``begin/end_server`` (two spans), vs an
  empty loop;
- ``span``: one RL-Insight span through our backend (``Recorder.rl_insight_span``): the yardstick
  every figure is also given in, since a loaded machine inflates them all alike.

CPU time is ``time.process_time`` (every thread of the process: the event log's flusher writes
too), per request: added cost = mode − baseline, shown for the least disturbed round (min) and the
median. Then memory: ``--inflight`` requests begun and not
yet ended (tracemalloc: bytes per request in flight, module state before/after).

Usage: ``python benchmarks/request_overhead.py [--requests 20000] [--rounds 5] [--yields 8]
[--against GIT_REF]``; ``--against`` alternates rounds with that commit's ``src/`` (each round a
fresh process) and prints before → after.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _server_class() -> type:
    from verl.workers.rollout.replica import TokenOutput

    class Stats:  # vLLM's RequestStateStats: arrival wall time, engine-core monotonic times
        __slots__ = ("arrival_time", "first_token_ts", "last_token_ts", "queued_ts", "scheduled_ts")

    class Engine:
        """Stands in for vLLM's AsyncLLM (a GPU engine): streams ``yields`` outputs, no work."""

        def __init__(self, yields: int) -> None:
            self.yields = yields

        async def generate(self, prompt: Any, sampling_params: Any, request_id: str) -> Any:
            stats = Stats()
            now = time.monotonic()
            stats.arrival_time, stats.queued_ts, stats.scheduled_ts = time.time(), now, now
            stats.first_token_ts = stats.last_token_ts = now
            out = SimpleNamespace(token_ids=[], finish_reason=None)
            for i in range(self.yields):
                out.token_ids.append(i)
                stats.last_token_ts = time.monotonic()
                yield SimpleNamespace(request_id=request_id, outputs=[out], metrics=stats, finished=False)

    class Server:
        """A VERL rollout server's shape: ``generate(prompt_ids, sampling_params, request_id)``."""

        def __init__(self, yields: int) -> None:
            self.engine = Engine(yields)
            self.replica_rank = 0
            self.global_steps = 1

        async def generate(
            self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **_: Any
        ) -> Any:
            final = None
            async for out in self.engine.generate(
                {"prompt_token_ids": prompt_ids}, sampling_params, request_id
            ):
                final = out
            assert final is not None
            return TokenOutput(
                token_ids=list(final.outputs[0].token_ids),
                log_probs=None,
                stop_reason="completed",
                extra_fields={"global_steps": self.global_steps},
            )

    return Server


class _Remote:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        result = self.fn(*args, **kwargs)
        if asyncio.iscoroutine(result):
            return result

        async def done() -> Any:
            return result

        return done()


def _client(server: Any) -> Any:
    from verl.workers.rollout.llm_server import LLMServerClient

    handle = SimpleNamespace(generate=_Remote(server.generate))
    lb = SimpleNamespace(
        require_acquire_fields=_Remote(lambda: ["request_id"]),
        require_release_fields=_Remote(lambda: ["request_id"]),
        acquire_server=_Remote(lambda request_id: ("127.0.0.1:20000", handle)),
        release_server=SimpleNamespace(remote=lambda **kw: None),
    )
    rollout = SimpleNamespace(name="vllm", full_determinism=False)
    return LLMServerClient(SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout)), lb)


async def _loop(client: Any, n: int, concurrency: int) -> None:
    params = {"max_tokens": 8}

    async def worker(k: int) -> None:
        for i in range(k):
            await client.generate(f"s{i}", prompt_ids=[1, 2, 3], sampling_params=params)

    per = n // concurrency
    await asyncio.gather(*(worker(per) for _ in range(concurrency)))


def _cpu_per_request(fn: Any, n: int) -> float:
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) / n * 1e6


def _set_capture(on: bool, out: str) -> None:
    from rl_trace_observer import config as config_mod
    from rl_trace_observer.capture import configure, reset

    reset()
    configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": out, "RL_TRACE_METRICS": "0"} if on else {}))


def _hooks(mode: str, server_cls: type) -> None:
    """Install the hooks ``mode`` asks for (``client``, ``server``, ``hooks`` = both), or none."""
    from rl_trace_observer.integrations.verl import requests, rollout_servers

    requests.uninstall()
    rollout_servers.uninstall()
    if mode in ("hooks", "client"):
        requests.install()
    if mode in ("hooks", "server"):
        rollout_servers._instrument(server_cls)


def _api_round(n: int) -> float:
    from rl_trace_observer.capture import requests as rq

    def run() -> None:
        for i in range(n):
            c = rq.begin_client(i, session="s", turn=1, prompt_tokens=3)
            s = rq.begin_server(i, replica=0, prompt_tokens=3, version=1)
            rq.end_server(s, response_tokens=8, status="completed")
            rq.end_client(c, response_tokens=8, status="completed", version=1)

    return _cpu_per_request(run, n)


def _reference_round(n: int) -> float:
    """One RL-Insight span through our backend's hot path (CPU of this process's threads; the drain
    process's share is not in it, see capture_overhead.py): the yardstick that makes this
    machine's figures comparable with others."""
    from rl_trace_observer.capture import get_recorder

    rec = get_recorder()
    assert rec is not None

    def run() -> None:
        for i in range(n):
            t = time.time_ns()
            rec.rl_insight_span("actor_update", t, t + 1000, {"state_lane_id": "rank_0", "step": i})

    return _cpu_per_request(run, n)


def _empty_round(n: int) -> float:
    def run() -> None:
        for _ in range(n):
            pass

    return _cpu_per_request(run, n)


def _memory(inflight: int, out: str) -> dict[str, float]:
    from rl_trace_observer.capture import requests as rq

    _set_capture(True, out)
    rq.end_client(rq.begin_client("warm-up"))  # the lane and pool exist before measuring
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    held = [rq.begin_client(f"r{i}", session="s", turn=1, prompt_tokens=3) for i in range(inflight)]
    during, peak = tracemalloc.get_traced_memory()
    for r in held:
        rq.end_client(r)
    del held
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "bytes_per_request_in_flight": (during - before) / inflight,
        "kept_after_all_ended_bytes": after - before,
        "peak_mib": peak / 2**20,
    }


def _measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """CPU µs per request of every mode, one value per round."""
    server_cls = _server_class()
    out = tempfile.mkdtemp(prefix="request-overhead-")
    n = args.requests
    loops = ("baseline", "client", "server", "hooks")
    results: dict[str, list[float]] = {k: [] for k in (*loops, "api", "span", "empty")}
    for _ in range(args.rounds):
        for mode in loops:
            _hooks(mode, server_cls)
            _set_capture(mode != "baseline", out)
            client = _client(server_cls(args.yields))
            asyncio.run(_loop(client, 2000, args.concurrency))  # warm-up
            results[mode].append(
                _cpu_per_request(lambda c=client: asyncio.run(_loop(c, n, args.concurrency)), n)
            )
            _hooks("none", server_cls)
        _set_capture(True, out)
        results["api"].append(_api_round(n))
        results["span"].append(_reference_round(n))
        results["empty"].append(_empty_round(n))
    return results


def _added(table: dict[str, float]) -> dict[str, float]:
    base = table["baseline"]
    return {
        "client": table["client"] - base,
        "server": table["server"] - base,
        "both": table["hooks"] - base,
        "api": table["api"] - table["empty"],
        "loop": base,
    }


def _report(results: dict[str, list[float]], args: argparse.Namespace) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}
    low = {k: min(v) for k, v in results.items()}  # on a shared machine the least disturbed round
    print(
        f"requests per round {args.requests}, rounds {len(results['baseline'])}, engine yields {args.yields}"
    )
    print(f"{'mode':<10} {'CPU µs/request: min':>20} {'median':>8}   rounds")
    for k, v in results.items():
        print(f"{k:<10} {low[k]:>20.2f} {med[k]:>8.2f}   " + " ".join(f"{x:.1f}" for x in v))
    for stat, table in (("min", low), ("median", med)):
        base = table["baseline"]
        print(
            f"[{stat}] added per request: client hook {table['client'] - base:.2f} µs, "
            f"server hook {table['server'] - base:.2f} µs, both {table['hooks'] - base:.2f} µs "
            f"({table['hooks'] / base:.2f}x the loop without us); the API alone "
            f"(two spans) {table['api'] - table['empty']:.2f} µs; target <= 10 µs"
        )
        span = table["span"] - table["empty"]
        print(
            f"[{stat}] in RL-Insight spans of this run ({span:.2f} µs each): both hooks "
            f"{(table['hooks'] - base) / span:.1f}, client {(table['client'] - base) / span:.1f}, "
            f"server {(table['server'] - base) / span:.1f}, API {(table['api'] - table['empty']) / span:.1f}"
        )


def _against(ref: str, args: argparse.Namespace) -> None:
    """Rounds alternate between ``ref``'s ``src/`` (extracted with ``git archive``) and this tree's,
    each in a fresh process running THIS script, so both sides see the same machine and the same
    benchmark; then the added costs side by side and after/before ratios."""
    root = Path(__file__).resolve().parent.parent
    tmp = Path(tempfile.mkdtemp(prefix="request-overhead-ref-"))
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=root, check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp, filter="data")
    sides = {f"before ({ref})": tmp / "src", "after (this tree)": root / "src"}
    results: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    one = [
        sys.executable, __file__, "--rounds", "1", "--json", "--requests", str(args.requests),
        "--yields", str(args.yields), "--concurrency", str(args.concurrency),
    ]  # fmt: skip
    for _ in range(args.rounds):
        for side, src in sides.items():
            env = {**os.environ, "PYTHONPATH": str(src)}
            done = subprocess.run(one, env=env, check=True, capture_output=True, text=True)
            for mode, values in json.loads(done.stdout.splitlines()[-1]).items():
                results[side].setdefault(mode, []).extend(values)
    for side, res in results.items():
        print(f"== {side}")
        _report(res, args)
    print(f"== before → after, {args.rounds} alternating rounds (CPU µs added per request)")
    for stat, pick in (("min", min), ("median", statistics.median)):
        before, after = ({k: pick(v) for k, v in res.items()} for res in results.values())
        b, a = _added(before), _added(after)
        print(
            f"[{stat}] "
            + ", ".join(
                f"{k} {b[k]:.2f} → {a[k]:.2f} ({a[k] / b[k]:.2f}x)"
                if b[k] > 0
                else f"{k} {b[k]:.2f} → {a[k]:.2f}"
                for k in ("client", "server", "both", "api", "loop")
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--yields", type=int, default=8, help="engine outputs per request (the tap's hops)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--inflight", type=int, default=10000)
    ap.add_argument("--against", metavar="GIT_REF", help="alternate rounds with this commit's src/")
    ap.add_argument("--json", action="store_true", help="(internal) one JSON line of the rounds")
    args = ap.parse_args()
    os.environ.setdefault("VERL_LOGGING_LEVEL", "ERROR")
    if args.against:
        _against(args.against, args)
        return
    results = _measure(args)
    if args.json:
        print(json.dumps(results))
        return
    _report(results, args)
    out = tempfile.mkdtemp(prefix="request-overhead-")
    mem = _memory(args.inflight, out)
    print(
        f"{args.inflight} requests in flight: {mem['bytes_per_request_in_flight']:.0f} B each (held by "
        f"the caller), {mem['kept_after_all_ended_bytes']:.0f} B kept once all ended, "
        f"peak {mem['peak_mib']:.1f} MiB"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
