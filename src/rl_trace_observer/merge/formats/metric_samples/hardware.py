"""Hardware exporters registered as RL-Insight's hardware guide does: node_exporter and Ascend's NPU exporter.

**node_exporter** (job ``node``/``node_exporter``, or ``node_*`` families) on the sampler's own node
becomes the host's source of truth, drawn under the host's ``Host`` process:

- CPU: ``node_cpu_seconds_total`` summed over CPUs gives, per sampling interval, the busy share
  100 · (1 − Δ(idle + iowait) / Δ(all modes)) — the quantity psutil's ``cpu_percent`` computes from
  the same ``/proc/stat`` — drawn as ``host_cpu_percent`` (the report's host-CPU rows read it);
- memory: ``node_memory_{MemTotal,MemAvailable,MemFree,Buffers,Cached}_bytes`` as gauges;
- network: ``node_network_{receive,transmit}_bytes_total`` per device, as rates;
- load: ``node_load1``.

One quantity, one track: while a node_exporter is drawn on a host, our psutil sampler's tracks of the
same quantities there (``host_cpu_percent``, ``host_memory_*``, ``host_network_*``, ``host_load1``)
are not drawn; its other node_* families (filesystems, disks, ...) are not drawn either.

**Ascend's NPU exporter** (``npu_chip_info_*`` families, one series per device by its ``id`` label):
each device's series become one process of their own, ``NPU <id>`` (beside the sampler, as a GPU
nobody used is ``GPU <k>``), the track names without the ``id`` and other per-device labels
(``vdie_id``, ``pcie_bus_info``, container / pod names).
"""

from __future__ import annotations

from dataclasses import replace

from .decode import SamplesFile, SeriesDef, SourceDef
from .tracks import Track, _track_name, snapshots, source_tracks

NODE_JOBS = ("node", "node_exporter", "node-exporter")
NODE_MEMORY = tuple(
    f"node_memory_{k}_bytes" for k in ("MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached")
)
NODE_NETWORK = ("node_network_receive_bytes", "node_network_transmit_bytes")
NODE_DRAWN = (*NODE_MEMORY, *NODE_NETWORK, "node_load1")
HOST_CPU = "host_cpu_percent"
PSUTIL_TWINS = (HOST_CPU, "host_memory_", "host_network_", "host_load1")  # prefixes of psutil's families
NPU_PREFIX = "npu_chip_info_"
NPU_DEVICE_LABELS = {"id", "vdie_id", "pcie_bus_info", "container_name", "namespace", "pod_name"}
IDLE_MODES = ("idle", "iowait")


def _families(file: SamplesFile, src: int) -> set[str]:
    return {s.family for s in file.series.values() if s.src == src}


def is_node_exporter(file: SamplesFile, source: SourceDef) -> bool:
    if source.kind != "prometheus" and "address" not in source.fields:
        return False
    if str(source.fields.get("job", "")).lower() in NODE_JOBS:
        return True
    return any(f.startswith("node_") for f in _families(file, source.src))


def is_npu_exporter(file: SamplesFile, source: SourceDef) -> bool:
    return source.kind != "host" and any(f.startswith(NPU_PREFIX) for f in _families(file, source.src))


def is_psutil_twin(track: Track) -> bool:
    return track.family.startswith(PSUTIL_TWINS)


def _only(file: SamplesFile, src: int, families: tuple[str, ...]) -> SamplesFile:
    """The file seen with only ``src``'s series of ``families`` (the rest of its hundreds unread)."""
    series = {i: s for i, s in file.series.items() if s.src == src and s.family in families}
    return replace(file, series=series, samples=[s for s in file.samples if s.src == src])


def cpu_busy_track(file: SamplesFile, src: int) -> Track | None:
    """Busy share of all CPUs per interval from ``node_cpu_seconds_total``, at the interval's start."""
    cpu = {i: s for i, s in file.series.items() if s.src == src and s.family == "node_cpu_seconds"}
    if not cpu:
        return None
    track = Track(src, _track_name(HOST_CPU, "gauge", ()), HOST_CPU, "gauge", {})
    prev_t: int | None = None
    prev: dict[int, float] = {}
    for sample, now in snapshots(s for s in file.samples if s.src == src):
        total = idle = 0.0
        for sid, s in cpu.items():
            if sid in now and sid in prev and now[sid] >= prev[sid]:
                d = now[sid] - prev[sid]
                total += d
                if s.labels.get("mode") in IDLE_MODES:
                    idle += d
        if prev_t is not None and total > 0:
            track.add(prev_t, 100.0 * (1.0 - idle / total))
        prev_t, prev = sample.t, {sid: now[sid] for sid in cpu if sid in now}
    return track if track.points else None


def node_tracks(file: SamplesFile, src: int) -> list[Track]:
    """What of a node_exporter is drawn on the host (see the module's docstring)."""
    tracks = source_tracks(_only(file, src, NODE_DRAWN), src)
    busy = cpu_busy_track(file, src)
    return [busy, *tracks] if busy is not None else tracks


def npu_tracks(file: SamplesFile, src: int) -> dict[str, list[Track]]:
    """``NPU <id>`` → that device's tracks, named without the per-device labels."""
    devices: dict[str, dict[int, SeriesDef]] = {}
    for i, s in file.series.items():
        if s.src == src and s.family.startswith(NPU_PREFIX) and "id" in s.labels:
            devices.setdefault(s.labels["id"], {})[i] = s
    samples = [s for s in file.samples if s.src == src]
    out: dict[str, list[Track]] = {}
    for device, series in sorted(devices.items(), key=lambda kv: (len(kv[0]), kv[0])):
        tracks = []
        for t in source_tracks(replace(file, series=series, samples=samples), src):
            rest = tuple(sorted((k, v) for k, v in t.labels.items() if k not in NPU_DEVICE_LABELS))
            tracks.append(replace(t, name=_track_name(t.family, t.kind, rest), labels=dict(rest)))
        out[f"NPU {device}"] = tracks
    return out
