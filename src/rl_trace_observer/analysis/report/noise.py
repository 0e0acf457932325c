"""The one noise model of per-step figures, shared by ``rl-trace diff`` and the watch's alert.

Two groups of steps differ beyond noise when their means are more than two standard errors of the
difference apart: ``2·√(s²_A/n_A + s²_B/n_B)`` (s: the sample standard deviation of each group's
per-step values). One step has no spread of its own; the watch's alert compares one new step with
the steps before it, and takes the new step's spread to be theirs (it is drawn from the same run),
which makes the band ``2·s·√(1/n + 1)`` — the same rule, not a second one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

SIGMAS = 2.0  # standard errors of the difference: the band's half-width


def noise_band(sd_a: float, n_a: int, sd_b: float, n_b: int) -> float:
    """Half-width of the band inside which the two groups' means differ only by noise."""
    return SIGMAS * math.sqrt((sd_a * sd_a / n_a if n_a else 0.0) + (sd_b * sd_b / n_b if n_b else 0.0))


def one_step_band(before: Sequence[float]) -> float:
    """The band for one new step against ``before`` (at least 2 values), its spread taken as theirs."""
    sd = statistics.stdev(before)
    return noise_band(sd, len(before), sd, 1)
