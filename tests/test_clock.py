"""kvconv.clock: device %globaltimer -> host CLOCK_MONOTONIC through the nearest earlier clock-sync pair, checked
against the rule written out value by value (host_i + (gpu - gpu_i), int64 wrap-around included)."""

from __future__ import annotations

import numpy as np
import pytest

from kvconv.clock import Clock
from kvconv.format import layout


def _pairs(gpu, host) -> np.ndarray:
    p = np.zeros(len(gpu), layout.DTYPES["clock_sync"])
    p["gpu_ns"], p["host_ns"] = gpu, host
    return p


def _rule(p: np.ndarray, t: np.ndarray) -> np.ndarray:
    out = np.empty(len(t), np.int64)
    for k, g in enumerate(t.tolist()):
        i = max(0, int(np.searchsorted(p["gpu_ns"], np.uint64(g), side="right")) - 1)
        v = (int(p["host_ns"][i]) + g - int(p["gpu_ns"][i])) % 2**64
        out[k] = v - 2**64 if v >= 2**63 else v
    return out


RNG = np.random.default_rng(7)
GPU = np.sort(RNG.integers(10**15, 10**15 + 10**12, 40)).astype(np.uint64)
SPANS = {  # device times of one chunk: [lo, hi]
    "between two pairs": (int(GPU[5]) + 10, int(GPU[6]) - 10),
    "spanning several pairs": (int(GPU[3]), int(GPU[20])),
    "before the first pair": (0, int(GPU[0]) - 1),
    "after the last pair": (int(GPU[-1]), int(GPU[-1]) + 10**9),
    "near 2**64": (2**64 - 10**6, 2**64 - 1),
    "the whole range": (0, 2**64 - 1),
}


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("host", ["behind", "ahead", "wrapping"])
def test_to_host_follows_the_nearest_earlier_pair(span, host):
    shift = {"behind": -123_456_789, "ahead": 987_654_321, "wrapping": 2**63 + 5}[host]
    p = _pairs(GPU, (GPU.astype(object) + shift) % 2**64)
    lo, hi = SPANS[span]
    for n in (1, 65, 5000):  # below and above the one-offset path's size
        t = np.sort(RNG.integers(lo, hi, n, dtype=np.uint64, endpoint=True))
        assert Clock(p).to_host(t).tolist() == _rule(p, t).tolist(), (span, host, n)
