"""AReaL integration: a clock anchor for each process's perf trace, off unless ``RL_TRACE_AREAL=1``.

AReaL's ``perf_tracer`` stamps events in µs since ``perf_counter_ns()`` at ``configure()``, an origin no
other process shares. :mod:`.anchor` wraps ``areal.utils.perf_tracer.configure`` when that module is
imported (an import hook; AReaL's files are never changed, and :func:`.anchor.uninstall` puts the
original back) and records, through the process's capture recorder, the wall-clock ns of that origin:
the merge then places every rank exactly. Loaded by importing :mod:`.register`, or by running the
training script under ``python -m rl_trace_observer.integrations.areal``.
"""
