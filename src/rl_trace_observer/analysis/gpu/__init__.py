"""What the GPUs did during every RL stage, from the Kineto kernels of the merged timeline.

- :mod:`.kinds`: which events are GPU work and which launch it; compute / comm / memory;
- :mod:`.store`: the kernels and launches as columns of ints, filled while the report streams;
- :mod:`.attribute`: each kernel's launch (the correlation id Kineto's ``ac2g`` flow carries), step
  and stage — by its launch, else by where it ran;
- :mod:`.breakdown`: busy / idle / overlap figures of one set of kernels (HTA's definitions);
- :mod:`.section`: the report's ``gpu`` section and the ``kernels`` / ``gpu_time`` SQL rows (one
  computation for both);
- :mod:`.answers`: what the answers and ``diff`` take from it.

Below the report (which shows it: ``report/gpu_tables.py``) and above the answers' interval
arithmetic; the SQL tables over it are ``query/report_tables.py``.
"""
