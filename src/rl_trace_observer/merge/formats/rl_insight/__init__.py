"""Our own RL-Insight event logs: the reader (:mod:`.format`), their step markers read while planning
(:mod:`.markers`) and what rollout servers' request spans imply at merge time (:mod:`.requests`:
engine phases, requests in flight)."""
