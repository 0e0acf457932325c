"""What tests, benchmarks and GPU checks use and the library never does: synthetic files in the real
wire formats of tools that cannot run here (GPU engines, :mod:`.tokenspeed`; an engine's vLLM-named
``/metrics``, :mod:`.vllm_metrics`), the real Perfetto
engine, offline, that loads what we write (:mod:`.perfetto`), and fault injection for the capture
writer (a loop-mounted ext4 to freeze, fill and remove, :mod:`.loopfs`; a traced training loop to
run on it, :mod:`.capture_load`, :mod:`.fault_runs`, :mod:`.fault_signals`). Nothing in capture,
integrations, merge or analysis imports this package."""
