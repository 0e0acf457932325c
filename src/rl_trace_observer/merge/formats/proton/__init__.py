"""Triton Proton ``chrome_trace`` files (TokenSpeed's scheduler ranks), the whole format in one folder:
what its files look like and how they are read and planned (:mod:`.format`), and how a rank's Proton
files align on the flow starts of its VizTracer report (:mod:`.pairing`)."""

from .format import Proton

__all__ = ["Proton"]
