"""What tests, benchmarks and GPU checks use and the library never does: synthetic files in the real
wire formats of tools that cannot run here (GPU engines, :mod:`.tokenspeed`) and the real Perfetto
engine, offline, that loads what we write (:mod:`.perfetto`). Nothing in capture, integrations,
merge or analysis imports this package."""
