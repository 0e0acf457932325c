"""Clocks: per-host corrections from measured offsets, per-artifact alignment on partner
events in one process, and the causality checks that judge the result."""
