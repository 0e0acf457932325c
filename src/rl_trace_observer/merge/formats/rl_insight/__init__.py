"""Our own RL-Insight event logs: the reader (:mod:`.reader`) and what rollout servers' request spans
imply at merge time (:mod:`.requests`: engine phases, requests in flight)."""
