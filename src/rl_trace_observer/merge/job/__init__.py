"""The per-file job, forward: read → align → passes → emit, one folder, one context object.

A job (:class:`.spec.Job`: one file, or a TokenSpeed rank's files) runs in a pool worker
(:mod:`.pool`) and returns bytes ready for the output plus the identities it declared and its
counts. Each file goes once through the stages, in this order, each a module of its own:

- :mod:`.read`     its bytes read once and decoded by its format (or left out, named);
- :mod:`.align`    placed on its partner's clock (a Torch trace on its RL-Insight log) or held
                   (a rank report's flow starts wait for the rank's Proton scopes);
- :mod:`.passes`   the passes over its events (the fused fast path, or the listed passes);
- :mod:`.counts`   what it read, kept and left out, and why (its manifest entry);
- :mod:`.emit`     the kept events handed to each :class:`.emit.Emitter` once per file: span rows
                   (``--shards``), then the output (Chrome JSON pieces, or the job's ``.pftrace``
                   sequence, :mod:`.emit_pftrace`).

What one file carries through the stages is one :class:`.file.FileJob`; what the job shares between
its files (partners, emitters, its result) is one :class:`.file.JobRun`. :mod:`.run` drives them.
"""

from .run import init_worker, run_job
from .spec import INFLIGHT_BYTES, Job, JobResult, Outcome, Task

__all__ = ["INFLIGHT_BYTES", "Job", "JobResult", "Outcome", "Task", "init_worker", "run_job"]
