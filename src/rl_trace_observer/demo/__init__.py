"""DEMO WORKLOAD for ``rl-trace demo`` — not part of the observer, never imported by it.

A small PPO-shaped loop that exercises every capture path the observer supports, on a laptop-sized
local Ray cluster: a driver, two trainer actors training a tiny torch policy on CPU (gloo all-reduce,
``torch.profiler`` traces), two rollout actors "generating" with the same policy in pure Python
(VizTracer traces), a weight-sync phase, RL-Insight spans with the stage names VERL uses, and trainer
metrics. It stands in for a VERL run so a new user can see the whole product work in one command;
nothing in it is a fake of an observer component — every trace and span goes through the real APIs.

Modules: ``model`` (the tiny policy, pure Python), ``rollout`` and ``trainer`` (actor bodies),
``observe`` (capture set-up inside each actor), ``driver`` (the loop on Ray), ``run`` (the whole
command: loop, collect, merge, report, and where to look).
"""
