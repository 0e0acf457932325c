"""After the merge: ``report/`` says where each step's time went; ``perfetto/`` is the real Perfetto
engine (offline, headless) that loads what we write; ``view_server`` serves one trace to the UI."""
