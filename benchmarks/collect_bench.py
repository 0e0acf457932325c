"""Throughput of ``rl-trace collect`` against a plain local copy of the same files, in the same run.

Two data sets in one node's output directory: many small files (process records, short event logs)
and a few large ones (Proton / VizTracer / Kineto traces). For each: the best of ``--repeat`` timings
of (a) ``shutil.copyfile`` of every file, (b) the same plus sha256 of every file (what collect also
does), (c) ``collect()`` over a single-node local Ray into a fresh directory. Printed: MB/s, the
ratio collect / plain copy, and the peak memory of the Ray worker that streamed the files and of the
driver (private memory growth, and RSS including shared object-store pages). The page cache is warm
for every variant (each reads the same files just read), so the figures compare the machinery, not
the disk. ``shutil.copyfile`` copies inside the kernel (sendfile): "copy+sha" is the fairer mark for
a copy that also proves its bytes.

    .venv/bin/python benchmarks/collect_bench.py [--small 2000 --small-kib 16 --large 4 --large-mib 128]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _make(root: Path, count: int, size: int, prefix: str) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    block = os.urandom(min(size, 4 * MiB))
    out = []
    for i in range(count):
        path = root / f"{prefix}-{i:05d}.bin"
        with open(path, "wb") as fh:
            left = size
            while left:
                n = min(left, len(block))
                fh.write(i.to_bytes(8, "little") + block[8:n] if n >= 8 else block[:n])
                left -= n
        out.append(path)
    return out


def _plain_copy(files: list[Path], src: Path, dst: Path, sha: bool) -> None:
    for f in files:
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        if sha:
            digest = hashlib.sha256()
            with open(f, "rb") as fh:
                while block := fh.read(8 * MiB):
                    digest.update(block)


def _best(repeat: int, fn: Callable[[Path], Any], scratch: Path) -> tuple[float, Any]:
    best, result = float("inf"), None
    for i in range(repeat):
        dst = scratch / f"dst-{time.monotonic_ns()}-{i}"
        started = time.perf_counter()
        result = fn(dst)
        best = min(best, time.perf_counter() - started)
        shutil.rmtree(dst, ignore_errors=True)
    return best, result


class _AnonPeak:
    """Samples this process's private memory (RssAnon) every 5 ms while collecting."""

    def __init__(self) -> None:
        self.start = self.peak = _status("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _status("RssAnon"))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


def _collect_fn(src: Path, chunk: int) -> Callable[[Path], Any]:
    from rl_trace_observer.integrations.ray.collect import collect

    def run(dst: Path) -> Any:
        _reset_peak()
        anon = _AnonPeak()
        report = collect(str(dst), output_dir=str(src), run_id="bench", progress=False, chunk_size=chunk)
        growth = anon.stop()
        assert report.ok and report.nodes[0].files_copied == report.nodes[0].files_found, report.problems()
        return report.nodes[0].worker_memory | {"driver_hwm": _status("VmHWM"), "driver_anon": growth}

    return run


def bench(name: str, files: list[Path], src: Path, scratch: Path, repeat: int, chunk: int) -> dict[str, Any]:
    total = sum(f.stat().st_size for f in files)
    _plain_copy(files, src, scratch / "warm", sha=False)  # warm the page cache for every variant
    shutil.rmtree(scratch / "warm")
    t_copy, _ = _best(repeat, lambda d: _plain_copy(files, src, d, sha=False), scratch)
    t_sha, _ = _best(repeat, lambda d: _plain_copy(files, src, d, sha=True), scratch)
    t_col, mem = _best(repeat, _collect_fn(src, chunk), scratch)
    return {
        "set": name,
        "files": len(files),
        "MB": total / 1e6,
        "copy MB/s": total / 1e6 / t_copy,
        "copy+sha MB/s": total / 1e6 / t_sha,
        "collect MB/s": total / 1e6 / t_col,
        "collect/copy": t_copy / t_col,
        "worker private growth MiB": (mem["anon_peak"] - mem["anon_start"]) / MiB,
        "worker RSS peak MiB (*)": (mem["hwm"] or 0) / MiB,
        "driver private growth MiB": mem["driver_anon"] / MiB,
        "driver RSS peak MiB (*)": mem["driver_hwm"] / MiB,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--small-kib", type=int, default=16)
    parser.add_argument("--large", type=int, default=4)
    parser.add_argument("--large-mib", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-mib", type=float, default=8.0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    scratch = Path(tempfile.mkdtemp(prefix="collect-bench-"))
    ray_tmp = tempfile.mkdtemp(prefix="rcb", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp  # never touch /tmp/ray/ray_current_cluster of others
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rows = []
        small_src, large_src = scratch / "small", scratch / "large"
        small = _make(small_src, args.small, args.small_kib * 1024, "record")
        rows.append(bench("small", small, small_src, scratch, args.repeat, int(args.chunk_mib * MiB)))
        shutil.rmtree(small_src)
        large = _make(large_src, args.large, args.large_mib * MiB, "trace")
        rows.append(bench("large", large, large_src, scratch, args.repeat, int(args.chunk_mib * MiB)))
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    keys = list(rows[0])
    print(f"collect benchmark: chunk {args.chunk_mib:g} MiB, best of {args.repeat}, {os.cpu_count()} CPUs")
    for key in keys:
        cells = [f"{r[key]:.2f}" if isinstance(r[key], float) else str(r[key]) for r in rows]
        print(f"{key:>27}  " + "  ".join(f"{c:>10}" for c in cells))
    print("(*) RSS includes pages of Ray's shared-memory object store that the process touched: the store")
    print(
        "    recycles them lazily and caps them at object_store_memory; private growth is what collect holds."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
