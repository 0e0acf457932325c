"""Synthetic data for tests and benchmarks: files in the real wire formats of tools that cannot
run here (GPU engines). Nothing in capture, integrations or merge imports this package."""
