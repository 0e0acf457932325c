"""After the merge: ``report/`` says where each step's time went, ``answers/`` computes the answers
it shows (idle with a cause, stragglers, critical path), ``view_server`` serves one trace to the UI.
(The offline Perfetto engine that tests load our outputs in is :mod:`rl_trace_observer.testing.perfetto`.)"""
