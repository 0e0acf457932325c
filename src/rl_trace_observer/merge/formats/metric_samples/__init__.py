"""The metric sampler's files (``*.samples.jsonl``, docs/FORMATS.md §13), the whole format in one
folder: the file as plain data (:mod:`.decode`), its samples as counter tracks (:mod:`.tracks`:
gauges, counter rates, histogram mean/p50/p99), where each source's tracks go (:mod:`.placement`),
and the format itself (:mod:`.format`: sniff, hints, read, the manifest entry)."""

from .format import MetricSamples

__all__ = ["MetricSamples"]
