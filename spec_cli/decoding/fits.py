"""Least-squares fits the cost model reads prices through (`batch_costs.BatchCosts`): a weighted line, for sizes not
seen, and a weighted monotone fit, so that more rows never read cheaper than fewer. Plain Python: a few points each,
fitted often."""

from __future__ import annotations


def monotone(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence nearest `values` in weighted least squares (pool adjacent violators): a value
    below the one before it is pooled with it, and the pool with the one before while still below, each pool at its
    weighted mean. Values already in order (a quiet machine's, most of the time) are their own fit."""
    if all(a <= b for a, b in zip(values, values[1:])):
        return values
    pools: list[list[float]] = []  # [mean, weight, values pooled]
    for value, weight in zip(values, weights):
        pools.append([value, weight, 1])
        while len(pools) > 1 and pools[-2][0] > pools[-1][0]:
            mean, weight, count = pools.pop()
            last = pools[-1]
            total = last[1] + weight
            last[0] = (last[0] * last[1] + mean * weight) / total
            last[1], last[2] = total, last[2] + count
    return [mean for mean, _, count in pools for _ in range(int(count))]


def weighted_line(points: dict[int, float], weights: dict[int, float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through `points` (size: seconds), each weighing `weights[size]`:
    the normal equations in closed form (plain Python: a few sizes, refitted every few calls, where NumPy's
    polyfit cost ~60 µs a fit). At least two sizes."""
    sw = sum(weights.values())
    sx = sum(w * x for x, w in weights.items())
    sy = sum(weights[x] * y for x, y in points.items())
    sxx = sum(w * x * x for x, w in weights.items())
    sxy = sum(weights[x] * x * y for x, y in points.items())
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return slope, (sy - slope * sx) / sw
