"""``rl-trace demo --watch``: a real ``rl-trace watch`` following the demo's run directory while it trains.

Why a process of its own (not a thread of the demo): the watch merges and reports every finished step,
and in the demo's process that work would hold the GIL while the driver times its steps. It is started
before the workload, on the run directory the demo writes into, and ended (SIGTERM: one last look at
the complete files) once the demo has collected everything; its state stays in ``OUT/watch``, so
``rl-trace watch OUT/run --out OUT/watch`` serves the same dashboard again at once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

URL_TIMEOUT_S = 60.0
END_TIMEOUT_S = 300.0


class DemoWatch:
    def __init__(self, run_dir: Path, out_dir: Path, port: int, log: Path) -> None:
        self.run_dir, self.out_dir, self.log = run_dir, out_dir, log
        self.url: str | None = None
        self._found = threading.Event()
        run_dir.mkdir(parents=True, exist_ok=True)  # the demo writes into it (its own mkdir tolerates it)
        cmd = [sys.executable, "-m", "rl_trace_observer.cli.main", "watch", str(run_dir)]
        cmd += ["--out", str(out_dir), "--port", str(port)]
        self._err = log.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err, stdin=subprocess.DEVNULL)
        threading.Thread(target=self._read_stdout, name="rl-trace-demo-watch", daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("ab") as copy:  # its stdout beside its stderr, in one log
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                copy.write(raw)
                copy.flush()
                if line.startswith("dashboard: ") and self.url is None:
                    self.url = line.split()[1]
                    self._found.set()
        self._found.set()  # it ended without a URL: the caller says so

    def dashboard_url(self) -> str | None:
        """The dashboard's URL once the watch listens (None: it did not start; ``self.log`` says why)."""
        self._found.wait(URL_TIMEOUT_S)
        return self.url

    def stop(self) -> int | None:
        """End the watch after one last look at the complete files; its exit code (None: killed)."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(END_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        finally:
            self._err.close()
