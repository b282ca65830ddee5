"""numpy helpers of the engine."""

from __future__ import annotations

import numpy as np


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values of the 1-D array ``values``, ascending (``np.unique(values)``).

    numpy 2.4's ``np.unique`` without ``return_inverse`` takes a hash-table path that measured
    35-45x slower than sorting here (1 M int64: 2.1-2.7 s against 0.06 s), so this sorts.

    >>> unique_sorted(np.array([3, 1, 3, 2, 1])).tolist()
    [1, 2, 3]
    """
    if len(values) == 0:
        return np.sort(values)
    ordered = np.sort(values)
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
