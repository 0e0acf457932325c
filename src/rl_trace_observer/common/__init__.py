"""Small pure helpers every layer may use, below them all (stdlib, orjson when installed): atomic file
writes (:mod:`.atomic`), the one JSON encoding (:mod:`.encoding`), and the estimator that turns
clock-exchange timestamps into offsets with bounds that hold (:mod:`.clock_offsets`: used in training
by ``integrations.ray.clock_sync``, the Ray transport, and by the merger's ``merge.clock``). Moved
here from ``capture/``, which stays the in-process layer and imports these."""
