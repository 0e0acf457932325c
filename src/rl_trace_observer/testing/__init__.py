"""Helpers for tests and benchmarks: files in the real wire formats of tools that cannot run here
(GPU engines), and fault injection for the capture writer (a loop-mounted ext4 to freeze, fill
and remove; a traced training loop to run on it). Nothing in capture, integrations or merge
imports this package."""
