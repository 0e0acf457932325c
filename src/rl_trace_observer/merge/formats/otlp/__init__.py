"""OTLP trace files (protobuf and OTLP/JSON): see :mod:`.format`."""

from .format import Otlp, span_markers

__all__ = ["Otlp", "span_markers"]
