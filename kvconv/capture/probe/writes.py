"""The write-address canary's probe: tell the tracer which tensors are KV caches and, per step, the engine's slot
mapping (token -> slot, request id). The tracer (``kvconv record --writes``, or ``KVCONV_WRITES=1``) records which
slots every block of the target kernels wrote; ``kvconv canary --writes`` compares the two (docs/CANARY.md).

    from kvconv.capture.probe.writes import WriteProbe
    probe = WriteProbe()                                    # the tracer loaded in this process, if any
    probe.register_cache(key_cache, page_size=16, name="L0.k")   # [num_pages, page_size, ...], contiguous
    with probe.step(step, slot_mapping, request_ids):      # per token: its slot (-1: padding) and request
        graph.replay()
    probe.release(finished_request_ids)                     # optional: the engine gave their slots back
    probe.free(slots)                                       # optional: these slots were given back

``WriteProbe(mirror=recorder)`` also keeps every step and release in a recorder of the probe's own dump
(:class:`~kvconv.capture.probe.writer.CanaryRecorder`, shared with the location and value canaries), tracer or not:
the slot ownership check (``kvconv canary --writes``) then reads the mapping from that dump too.

Nothing here needs torch: tensors are read through ``data_ptr()`` / ``numel()`` / ``element_size()`` and moved to
the host with ``.cpu()``; numpy arrays and lists work for the mappings. The probe talks to the tracer library in the
same process (``CUDA_INJECTION64_PATH``) through ``ctypes``; without a tracer, or with write recording off, it says
so once (a ``WriteProbeWarning``) and records nothing: there is no dump to record into.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True):
    ...     warnings.simplefilter("always")
    ...     p = WriteProbe(library="/nonexistent/libkvconv_tracer.so")
    >>> p.active
    False
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
import warnings

import numpy as np

from kvconv.format import layout

PAD = layout.ENUMS["slot_map_flags"]["pad"]
RELEASE = layout.ENUMS["slot_map_flags"]["release"]
_WRITES_OFF = -10  # kvconv_register_cache / kvconv_record_step: KVCONV_WRITES is not set in the traced process
_WHY = {-1: "base, size, slot_bytes and page_size must be nonzero", -2: "too many caches (256 at most)",
        -3: "it overlaps a cache registered before", -4: "the tracer could not update the device's cache table"}


class WriteProbeWarning(UserWarning):
    """The probe cannot reach a tracer that records writes: nothing is recorded."""


def _library(path: str | None):
    path = path or os.environ.get("CUDA_INJECTION64_PATH")
    if not path:
        return None, "no tracer in this process (CUDA_INJECTION64_PATH is not set: run under kvconv record --writes)"
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)  # only the copy already loaded
        reg, step = lib.kvconv_register_cache, lib.kvconv_record_step
    except (OSError, AttributeError) as e:
        return None, f"the tracer {path} is not loaded here or records no writes ({e})"
    reg.restype = ctypes.c_int
    reg.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p]
    step.restype = ctypes.c_int
    step.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p,
                     ctypes.c_void_p, ctypes.c_void_p]
    return lib, None


def _host(x, dtype) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (a device tensor is copied to the host: one synchronisation)
        x = x.detach().reshape(-1).cpu().numpy()
    return np.ascontiguousarray(np.asarray(x).reshape(-1), dtype=dtype)


class WriteProbe:
    """Registers caches and records steps in the tracer of this process (see the module docstring)."""

    def __init__(self, *, library: str | None = None, mirror=None) -> None:
        self._lib, why = _library(library)
        self.mirror = mirror  # a CanaryRecorder (add_step) keeping the steps in the probe's own dump, or None
        self.caches: dict[str, int] = {}
        self.steps = 0
        self.releases = 0
        self._last_step = 0
        if why:
            self._off(why)

    @property
    def active(self) -> bool:
        return self._lib is not None

    def _off(self, why: str) -> None:
        if self._lib is not None or not hasattr(self, "_warned"):
            warnings.warn(f"kvconv write probe: {why}; nothing is recorded", WriteProbeWarning, stacklevel=3)
            self._warned = True
        self._lib = None

    def register_cache(self, tensor, *, page_size: int, name: str, slot_bytes: int | None = None) -> int | None:
        """Register a KV cache tensor shaped ``[num_pages, page_size, ...]`` (contiguous): slot ``s`` lies at
        ``data_ptr() + s * slot_bytes`` (default: the tensor's bytes over ``num_pages * page_size``). Returns the cache
        id the tracer's records carry, or None when nothing is recorded."""
        nbytes = int(tensor.numel()) * int(tensor.element_size())
        if slot_bytes is None:
            slots = int(tensor.shape[0]) * int(page_size)
            if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
                raise ValueError(f"cache {name!r}: not contiguous; pass slot_bytes= for a strided layout")
            if slots <= 0 or nbytes % slots:
                raise ValueError(f"cache {name!r}: {nbytes} bytes do not split into {slots} slots of equal size")
            slot_bytes = nbytes // slots
        if self._lib is None:
            return None
        r = self._lib.kvconv_register_cache(int(tensor.data_ptr()), nbytes, int(slot_bytes), int(page_size),
                                            name.encode("utf-8"))
        if r == _WRITES_OFF:
            self._off("the tracer was started without write recording (kvconv record --writes / KVCONV_WRITES=1)")
            return None
        if r < 0:
            raise ValueError(f"cache {name!r} not registered: {_WHY.get(r, f'error {r}')}")
        self.caches[name] = r
        return r

    @contextlib.contextmanager
    def step(self, step: int, slot_mapping, request_ids=None, *, pad=None):
        """Record one step around the launches it makes: token ``i`` maps to ``slot_mapping[i]`` for request
        ``request_ids[i]`` (0: none); ``pad`` marks padding rows (default: the tokens whose slot is negative)."""
        slots = _host(slot_mapping, np.int64)
        reqs = np.zeros(len(slots), np.uint64) if request_ids is None else _host(request_ids, np.uint64)
        pads = slots < 0 if pad is None else _host(pad, bool)
        if len(reqs) != len(slots) or len(pads) != len(slots):
            raise ValueError(f"step {step}: {len(slots)} slots, {len(reqs)} request ids, {len(pads)} pad flags")
        flags = np.where(pads, PAD, 0).astype(np.uint32)
        self._last_step = int(step)
        begin = time.monotonic_ns()
        yield
        end = time.monotonic_ns()
        if self.mirror is not None:
            self.mirror.add_step(step=int(step), begin_ns=begin, end_ns=end, slots=slots, request_ids=reqs,
                                 flags=flags)
        if self._lib is None:
            return
        r = self._lib.kvconv_record_step(int(step), begin, end, len(slots), slots.ctypes.data, reqs.ctypes.data,
                                         flags.ctypes.data)
        if r == _WRITES_OFF:
            self._off("the tracer was started without write recording (kvconv record --writes / KVCONV_WRITES=1)")
            return
        self.steps += 1

    def release(self, request_ids) -> None:
        """The engine gave back every slot these requests hold (finished, aborted or preempted requests): later
        steps may map them to other requests. Optional: without it, ``kvconv canary --writes`` assumes a request
        holds its slots until its last step. Recorded at the host time of the call, which orders it against the
        steps (under async scheduling a step dispatched before the call still counts as before it)."""
        self._record_release(*release_rows(request_ids=request_ids))

    def free(self, slots) -> None:
        """The engine gave back these slots (``BlockPool.free_blocks``' blocks, as slots: page * page_size +
        offset): later steps may map them to other requests. Optional, as :meth:`release`."""
        self._record_release(*release_rows(slots=slots))

    def _record_release(self, slots: np.ndarray, reqs: np.ndarray, flags: np.ndarray) -> None:
        if not len(slots):
            return
        now = time.monotonic_ns()
        if self.mirror is not None:
            self.mirror.add_step(step=self._last_step, begin_ns=now, end_ns=now, slots=slots, request_ids=reqs,
                                 flags=flags)
        if self._lib is None:
            return
        r = self._lib.kvconv_record_step(self._last_step, now, now, len(slots), slots.ctypes.data, reqs.ctypes.data,
                                         flags.ctypes.data)
        if r == _WRITES_OFF:
            self._off("the tracer was started without write recording (kvconv record --writes / KVCONV_WRITES=1)")
            return
        self.releases += 1


def release_rows(*, request_ids=None, slots=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The slot_map rows (slots, request ids, flags) of one release: a write_step record whose rows all carry the
    ``release`` flag (docs/FORMAT.md, slot_map). ``request_ids``: slot -1, the request (every slot it holds);
    ``slots``: the slot, request 0.

    >>> release_rows(request_ids=[6])
    (array([-1]), array([6], dtype=uint64), array([2], dtype=uint32))
    """
    if (request_ids is None) == (slots is None):
        raise ValueError("a release names request_ids or slots")
    if request_ids is not None:
        reqs = _host(request_ids, np.uint64)
        if (reqs == 0).any():
            raise ValueError("release: request id 0 is no request")
        s = np.full(len(reqs), -1, np.int64)
    else:
        s = _host(slots, np.int64)
        if (s < 0).any():
            raise ValueError("free: a slot is negative")
        reqs = np.zeros(len(s), np.uint64)
    return s, reqs, np.full(len(s), RELEASE, np.uint32)
