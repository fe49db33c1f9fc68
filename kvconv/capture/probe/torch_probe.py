"""The torch side of the location canary: snapshot, compare per page on the device, record.

Every watched buffer is a contiguous tensor shaped ``[num_pages, page_elems]`` of any dtype (bf16, fp8, fp32, ...).
Pages are compared on their raw bits (the buffer viewed as the widest integer type that divides a page), so NaN pages
do not read as changed on every step and a write of -0.0 over +0.0 is seen.

Snapshot modes:
- ``clone``: a copy of the buffer, kept in one preallocated tensor; after the replay ``(words != snap).any(dim=1)``.
  Exact; costs one buffer of memory.
- ``checksum``: one 64-bit weighted sum per page (odd random weights, wrapping arithmetic): ``sum(word_i * w_i)``.
  Costs 8 bytes per page to keep; a single changed word always changes the sum (odd weights are invertible modulo
  2**64); several changed words cancel out with negligible probability. The product is computed in chunks of
  ``chunk_bytes`` so the transient memory stays bounded.
- ``auto``: clone up to ``clone_limit_bytes``, checksum above.

All work is queued on the current stream, the one the replay runs on. :meth:`Canary.compare` synchronises once (to read
the changed-page mask); its time therefore includes waiting for the replay unless the caller has synchronised.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from kvconv.capture.probe.writer import CanaryRecorder, RecorderOwner

_INT_VIEWS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


@dataclass
class StepResult:
    step: int
    buffer_id: int
    buffer: str
    expected: np.ndarray
    changed: np.ndarray
    excluded: np.ndarray

    @property
    def unexpected(self) -> np.ndarray:
        return np.setdiff1d(np.setdiff1d(self.changed, self.expected), self.excluded)

    @property
    def missing(self) -> np.ndarray:
        return np.setdiff1d(np.setdiff1d(self.expected, self.changed), self.excluded)


def _words(buf: torch.Tensor) -> torch.Tensor:
    """``buf`` as ``[num_pages, page_words]`` of the widest integer type that divides a page (a view, no copy)."""
    if buf.dim() != 2:
        raise ValueError(f"a watched buffer must be shaped [num_pages, page_elems], not {tuple(buf.shape)}")
    if not buf.is_contiguous():
        raise ValueError("a watched buffer must be contiguous")
    b = buf.view(torch.uint8).reshape(buf.shape[0], -1)
    for size, dt in _INT_VIEWS:
        if b.shape[1] % size == 0 and b.data_ptr() % size == 0:
            return b.view(dt)
    return b  # pragma: no cover - uint8 always divides


def expected_pages(slot_locations, slots_per_page: int, num_pages: int) -> np.ndarray:
    """``unique(slot_locations // slots_per_page)`` over the valid slots (negative pads and slots past the buffer are
    never expected)."""
    if isinstance(slot_locations, torch.Tensor):
        locs = slot_locations.detach().reshape(-1).to("cpu", torch.int64).numpy()
    else:
        locs = np.asarray(slot_locations, dtype=np.int64).reshape(-1)
    locs = locs[(locs >= 0) & (locs < num_pages * slots_per_page)]
    return np.unique(locs // slots_per_page)


class WatchedBuffer:
    """One buffer under the canary; made by :meth:`Canary.watch`."""

    def __init__(self, buf: torch.Tensor, *, name: str, buffer_id: int, page_size: int, compression: int,
                 excluded, mode: str, clone_limit_bytes: int, chunk_bytes: int, seed: int) -> None:
        self.buf = buf
        self.words = _words(buf)
        self.name = name
        self.buffer_id = buffer_id
        self.num_pages = int(buf.shape[0])
        self.page_size = int(page_size)
        self.compression = int(compression)
        self.slots_per_page = self.page_size * self.compression
        if self.slots_per_page <= 0:
            raise ValueError("page_size and compression must be positive")
        self.excluded = np.unique(np.asarray(list(excluded), dtype=np.int64))
        nbytes = buf.numel() * buf.element_size()
        if mode == "auto":
            mode = "clone" if nbytes <= clone_limit_bytes else "checksum"
        if mode not in ("clone", "checksum"):
            raise ValueError(f"mode must be clone, checksum or auto, not {mode!r}")
        self.mode = mode
        if mode == "clone":
            self._snap = torch.empty_like(self.words)
        else:
            rng = np.random.default_rng(seed)
            w = rng.integers(0, np.iinfo(np.uint64).max, size=self.words.shape[1], dtype=np.uint64,
                             endpoint=True) | np.uint64(1)
            self._weights = torch.from_numpy(w.view(np.int64)).to(buf.device)
            self._sums = torch.empty(self.num_pages, dtype=torch.int64, device=buf.device)
            page_bytes = self.words.shape[1] * self.words.element_size() * 2  # int64 product per word
            self._chunk_pages = max(1, chunk_bytes // max(1, page_bytes))

    def _checksum(self, out: torch.Tensor) -> torch.Tensor:
        w = self.words
        for s in range(0, self.num_pages, self._chunk_pages):
            part = w[s : s + self._chunk_pages]
            if part.dtype != torch.int64:
                part = part.to(torch.int64)
            torch.sum(part * self._weights, dim=1, out=out[s : s + self._chunk_pages])
        return out

    def snapshot(self) -> None:
        if self.mode == "clone":
            self._snap.copy_(self.words)
        else:
            self._checksum(self._sums)

    def changed_mask(self) -> torch.Tensor:
        """A bool tensor [num_pages] on the buffer's device, queued on the current stream."""
        if self.mode == "clone":
            return (self.words != self._snap).any(dim=1)
        return self._checksum(torch.empty_like(self._sums)) != self._sums


class Canary(RecorderOwner):
    """Watches buffers across replays and records one canary record per (step, buffer).

    ``out`` is a dump path (a :class:`CanaryRecorder` is made for it) or a recorder. ``timings`` holds, per step,
    the host nanoseconds spent in :meth:`snapshot` and :meth:`compare`.
    """

    def __init__(self, out: str | os.PathLike | CanaryRecorder, *, metadata: dict | None = None,
                 context_id: int = 0, device_id: int | None = None, clone_limit_bytes: int = 1 << 30,
                 chunk_bytes: int = 256 << 20) -> None:
        if not isinstance(out, (str, os.PathLike)):
            self.recorder = out  # a CanaryRecorder, or anything with its add() and close()
        else:
            if device_id is None:
                device_id = torch.cuda.current_device() if torch.cuda.is_available() else 0
            self.recorder = CanaryRecorder(out, context_id=context_id, device_id=device_id, metadata=metadata)
        self.clone_limit_bytes = clone_limit_bytes
        self.chunk_bytes = chunk_bytes
        self.buffers: list[WatchedBuffer] = []
        self.timings: list[tuple[int, int]] = []
        self._snap_ns = 0
        self._snapped = False

    def watch(self, buf: torch.Tensor, *, name: str, page_size: int, compression: int = 1, excluded=(0,),
              mode: str = "auto", buffer_id: int | None = None) -> WatchedBuffer:
        wb = WatchedBuffer(buf, name=name, buffer_id=len(self.buffers) if buffer_id is None else buffer_id,
                           page_size=page_size, compression=compression, excluded=excluded, mode=mode,
                           clone_limit_bytes=self.clone_limit_bytes, chunk_bytes=self.chunk_bytes,
                           seed=0x6B76636F6E76 + len(self.buffers))
        self.buffers.append(wb)
        return wb

    def snapshot(self) -> None:
        """Queue the snapshot of every watched buffer (call right before the replay)."""
        t = time.perf_counter_ns()
        for wb in self.buffers:
            wb.snapshot()
        self._snapped = True
        self._snap_ns = time.perf_counter_ns() - t

    def compare(self, step: int, slot_locations, *, record: bool = True) -> list[StepResult]:
        """Compare every watched buffer with its snapshot (call right after the replay) and record the results.

        ``slot_locations``: the main-cache slots this step's real tokens write (tensor or array); pads may be
        included as negative ids, which are dropped.
        """
        if not self._snapped:
            raise RuntimeError("Canary.compare() without a snapshot() before the replay")
        self._snapped = False
        t = time.perf_counter_ns()
        masks = [wb.changed_mask() for wb in self.buffers]
        host = torch.cat(masks).cpu().numpy() if masks else np.zeros(0, dtype=bool)  # the one synchronisation
        host_ns = time.monotonic_ns()
        out: list[StepResult] = []
        pos = 0
        exp_cache: dict[tuple[int, int], np.ndarray] = {}
        for wb in self.buffers:
            changed = np.flatnonzero(host[pos : pos + wb.num_pages])
            pos += wb.num_pages
            key = (wb.slots_per_page, wb.num_pages)
            if key not in exp_cache:
                exp_cache[key] = expected_pages(slot_locations, wb.slots_per_page, wb.num_pages)
            exp = exp_cache[key]
            res = StepResult(step, wb.buffer_id, wb.name, exp, changed, wb.excluded)
            out.append(res)
            if record:
                self.recorder.add(step=step, buffer_id=wb.buffer_id, name=wb.name, num_pages=wb.num_pages,
                                  page_size=wb.page_size, compression=wb.compression, expected=exp,
                                  changed=changed, excluded=wb.excluded, host_ns=host_ns, snapshot=wb.mode)
        self.timings.append((self._snap_ns, time.perf_counter_ns() - t))
        return out

    @contextlib.contextmanager
    def step(self, step: int, slot_locations):
        """``with canary.step(i, out_cache_loc): graph.replay()``; the results are in :attr:`last`."""
        self.snapshot()
        yield self
        self.last = self.compare(step, slot_locations)

