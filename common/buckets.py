"""Histogram buckets as the kubelet declares them (Go's client_golang, not Python's defaults),
so podvisor's kubelet-named histograms bucket like a kubelet's and dashboards carry over."""

from __future__ import annotations

__all__ = ["DEF_BUCKETS", "exponential_buckets"]

# prometheus.DefBuckets (the kubelet's metrics.DefBuckets); Python's default adds .075, .75, 7.5
DEF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """client_golang's ``ExponentialBuckets``: ``count`` buckets, the first ``start``, each the
    previous times ``factor``."""
    if count < 1 or start <= 0 or factor <= 1:
        raise ValueError("exponential_buckets needs count >= 1, start > 0, factor > 1")
    return tuple(start * factor ** i for i in range(count))
