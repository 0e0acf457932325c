"""PyTorch profiler (Kineto) traces, the whole format in one folder: what its files look like and how
they are read and planned (:mod:`.format`), and how a trace aligns on its process's RL-Insight
stages (:mod:`.pairing`)."""

from .format import Kineto

__all__ = ["Kineto"]
