"""Paired bootstrap statistics for the evaluation report. Pure stdlib.

Every statistic the report needs is a function of per-task column means
(a success rate, a ratio of two success rates, a difference of two ratios),
so one routine does them all: `bootstrap(columns, statistic)` resamples
*task indices* with replacement and applies `statistic` to the column means
of each resample. Columns are aligned by task (row i of every column is the
same task), which is what makes the bootstrap paired: the noise that a hard
task adds to one config's score it also adds to the reference's.

Resamples are drawn from a `random.Random(seed)` that depends only on the
number of tasks, so a report is reproducible bit for bit and two statistics
over the same task set use the same resamples.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 1
DEFAULT_CONFIDENCE = 0.95

# A statistic maps the column means of one resample to a number, or None
# where it is undefined (e.g. a ratio whose denominator resampled to 0).
Statistic = Callable[[Sequence[float]], Optional[float]]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a percentile bootstrap interval.

    `value` is the statistic on the full sample; `lo`/`hi` are None where the
    interval is undefined (no tasks, or most resamples undefined). `n` is the
    number of tasks it is computed over.
    """

    value: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    n: int

    def excludes(self, x: float) -> bool:
        """True when the whole interval lies strictly on one side of x."""
        if self.lo is None or self.hi is None:
            return False
        return self.lo > x or self.hi < x

    def to_dict(self) -> dict:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "n": self.n}


EMPTY = Estimate(None, None, None, 0)


def mean(xs: Sequence[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method).

    REQUIRES: sorted_xs is non-empty and sorted ascending; 0 <= q <= 100.
    """
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = (len(sorted_xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    frac = pos - lo
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * frac


@functools.lru_cache(maxsize=32)
def resample_indices(n: int, resamples: int, seed: int) -> tuple:
    """`resamples` index tuples of length n drawn with replacement.

    Cached because the report asks for many statistics over the same task
    count; the seed is mixed with n so different task counts do not share a
    stream prefix.
    """
    rng = random.Random(seed * 1_000_003 + n)
    population = range(n)
    return tuple(tuple(rng.choices(population, k=n)) for _ in range(resamples))


def bootstrap(
    columns: Sequence[Sequence[float]],
    statistic: Statistic,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Estimate:
    """Paired percentile bootstrap of `statistic` over aligned columns.

    REQUIRES: all columns have the same length (one row per task).
    The interval is None when more than half of the resamples give an
    undefined statistic: a percentile over the rest would be biased.
    """
    if not columns:
        raise ValueError("bootstrap needs at least one column")
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise ValueError("bootstrap columns must be aligned (same length)")
    if n == 0:
        return EMPTY
    point = statistic([sum(c) / n for c in columns])
    if point is None:
        return Estimate(None, None, None, n)
    values = []
    for idx in resample_indices(n, resamples, seed):
        means = [sum(map(c.__getitem__, idx)) / n for c in columns]
        v = statistic(means)
        if v is not None:
            values.append(v)
    if len(values) * 2 < resamples:
        return Estimate(point, None, None, n)
    values.sort()
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo = percentile(values, tail)
    hi = percentile(values, 100.0 - tail)
    return Estimate(point, lo, hi, n)


def _ratio(m: Sequence[float]) -> Optional[float]:
    return m[0] / m[1] if m[1] > 0 else None


def _diff(m: Sequence[float]) -> Optional[float]:
    return m[0] - m[1]


def _rel_diff(m: Sequence[float]) -> Optional[float]:
    return (m[0] - m[1]) / m[2] if m[2] > 0 else None


def mean_ci(xs: Sequence[float], **kw) -> Estimate:
    """Mean of xs with a bootstrap interval."""
    return bootstrap([list(xs)], lambda m: m[0], **kw)


def ratio_ci(num: Sequence[float], den: Sequence[float], **kw) -> Estimate:
    """mean(num) / mean(den), paired by row; None where mean(den) is 0."""
    return bootstrap([list(num), list(den)], _ratio, **kw)


def diff_ci(a: Sequence[float], b: Sequence[float], **kw) -> Estimate:
    """mean(a) - mean(b), paired by row."""
    return bootstrap([list(a), list(b)], _diff, **kw)


def rel_diff_ci(
    a: Sequence[float], b: Sequence[float], ref: Sequence[float], **kw
) -> Estimate:
    """(mean(a) - mean(b)) / mean(ref): the difference of two relative
    successes against the same reference, paired by row."""
    return bootstrap([list(a), list(b), list(ref)], _rel_diff, **kw)


def align(*by_task: dict) -> tuple:
    """Rows for the tasks present (and not None) in every mapping.

    Returns (task_ids, column_1, column_2, ...), task ids sorted so the
    result does not depend on dict order.
    """
    common = set(by_task[0])
    for d in by_task[1:]:
        common &= set(d)
    ids = sorted(t for t in common if all(d[t] is not None for d in by_task))
    return (ids, *[[float(d[t]) for t in ids] for d in by_task])
