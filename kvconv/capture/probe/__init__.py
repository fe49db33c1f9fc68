"""The location canary probe: snapshot KV buffers before a CUDA-graph replay, compare per page after it, record.

    from kvconv.capture.probe import Canary
    canary = Canary("run.kvdump", metadata={"producer": "my-engine"})
    canary.watch(index_k, name="L0.index_k", page_size=64, compression=4, excluded=[0])   # [num_pages, page_elems]
    for step in range(n):
        with canary.step(step, out_cache_loc):     # main-cache slots the step should write
            graph.replay()
    canary.close()                                 # writes the dump; `kvconv canary run.kvdump` checks it

torch is imported only when :class:`Canary` is used (``kvconv.capture.probe.torch_probe``); :class:`CanaryRecorder` (the
record writer) and the value canary's :class:`ValueProbe` (``kvconv.capture.probe.values``: numpy, or torch tensors
it is handed) need numpy alone.
"""

from __future__ import annotations

from kvconv.capture.probe.values import ValueProbe, digest_rows
from kvconv.capture.probe.writer import CanaryRecorder

__all__ = ["Canary", "CanaryRecorder", "StepResult", "ValueProbe", "digest_rows", "expected_pages"]


def __getattr__(name: str):
    if name in ("Canary", "StepResult", "expected_pages", "WatchedBuffer"):
        from kvconv.capture.probe import torch_probe

        return getattr(torch_probe, name)
    raise AttributeError(name)
