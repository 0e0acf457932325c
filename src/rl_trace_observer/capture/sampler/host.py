"""The host through psutil (imported only in the sampler): CPU, memory, network.

CPU is psutil's system-wide busy share since the previous call (so the first call only primes
it); network bytes are the kernel's running totals (counters: the merger turns them into rates).
"""

from __future__ import annotations

from typing import Any

GAUGES = ("host_cpu_percent", "host_memory_used_bytes", "host_memory_available_bytes", "host_load1")
COUNTERS = ("host_network_receive_bytes_total", "host_network_transmit_bytes_total")


class Host:
    def __init__(self, psutil: Any | None = None) -> None:
        self.reason: str | None = None
        self._ps: Any = psutil
        self.info: dict[str, Any] = {}
        try:
            if self._ps is None:
                import psutil as _psutil

                self._ps = _psutil
            self._ps.cpu_percent(interval=None)  # primes the "since last call" window
            self.info = {
                "cpus": self._ps.cpu_count(),
                "memory_total_bytes": int(self._ps.virtual_memory().total),
            }
        except ImportError:
            self.reason = "psutil is not installed (pip install 'rl-trace-observer[metrics]')"
            self._ps = None
        except Exception as exc:
            self.reason = f"psutil unavailable: {exc}"
            self._ps = None

    @property
    def available(self) -> bool:
        return self._ps is not None

    def sample(self) -> dict[str, float]:
        ps = self._ps
        if ps is None:
            return {}
        values: dict[str, float] = {}
        try:
            values["host_cpu_percent"] = float(ps.cpu_percent(interval=None))
            mem = ps.virtual_memory()
            values["host_memory_used_bytes"] = float(mem.total - mem.available)
            values["host_memory_available_bytes"] = float(mem.available)
            values["host_load1"] = float(ps.getloadavg()[0])
            net = ps.net_io_counters()
            if net is not None:
                values["host_network_receive_bytes_total"] = float(net.bytes_recv)
                values["host_network_transmit_bytes_total"] = float(net.bytes_sent)
        except Exception:
            pass
        return values
