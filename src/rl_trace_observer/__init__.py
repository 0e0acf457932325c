"""RL Trace Observer: one correct timeline for distributed RL training runs.

Importing this package (or ``capture`` and ``merge``) imports nothing heavy and changes nothing:
framework integrations live in ``rl_trace_observer.integrations.*`` and load their framework lazily.
"""

__version__ = "0.1.0"
