"""The value canary's probe (right slot, wrong data): per step and watched cache, for every slot the step maps, a 64-bit
digest of the row the engine meant to write there and of what the slot holds before and after the step.
``kvconv validate`` compares them (kvconv.check.canary.value; docs/CANARY.md).

    from kvconv.capture.probe.values import ValueProbe
    probe = ValueProbe("run.values.kvdump", metadata={"producer": "my-engine"})   # or a CanaryRecorder: one dump
    probe.watch(k_cache, name="L0.k", page_size=16)         # [num_pages, page_size, ...], contiguous
    with probe.step(step, slot_mapping, request_ids):       # per token: its slot (-1: padding) and request
        probe.expect_values(step, "L0.k", k_rows)           # the rows the engine meant to write, one per token
        graph.replay()
    probe.close()                                           # writes the dump

Where the expected rows come from (the record's flags say which):

- ``given``: rows the caller hands the probe (``expect_values`` or ``step(..., expect={name: rows})``), e.g. the
  K/V the engine computed before copying them into the graph's static source buffer: a buffer not refilled is seen;
- ``source``: the source tensor named at ``watch(..., source=tensor)``, read before the step: the rows the kernel is
  handed (a kernel converting or placing them wrongly is seen, a stale buffer is not);
- ``eager``: ``step(..., eager=fn)``: ``fn(copies)`` runs the step eagerly on copies of the watched caches (a dict
  name -> copy) before the replay; its written slots are the reference.

One digest (:func:`kvconv.capture.probe.digest.digest_rows`) serves both sides. Rows are compared bit for bit as
stored: give rows in the cache's dtype (after the engine's own conversion), or use the eager reference. Two paths
make the digests: the torch/numpy path (gathers and elementwise int64 ops; one synchronisation a step) and, where
every watched cache is a torch CUDA tensor on one device with 8-byte aligned slots of a multiple of 8 bytes, the
fused path (:mod:`kvconv.capture.probe.fused`; ``ValueProbe(fused=...)``, default: where it applies, unless
KVCONV_VALUE_FUSED=0), whose records are made at the next step so that the host's work overlaps the device's. Both
give the same bits; what each costs: docs/CANARY.md.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np

from kvconv.capture.probe import fused
from kvconv.capture.probe.digest import (
    digest_all,
    digest_rows,
    digest_words,
    is_torch,
    read_back,
    row_words,
    word_chunks,
)
from kvconv.capture.probe.writer import CanaryRecorder, RecorderOwner
from kvconv.format import layout

__all__ = ["FLAGS", "ValueProbe", "digest_rows", "digest_words", "row_words"]

FLAGS = layout.ENUMS["value_digest_flags"]
_RECORD = layout.DTYPES["value_digest"]
# ValueProbe._record packs the records as 9 little-endian words: 7 of 8 bytes, then cache_id|row, row_bytes|flags
assert [(_RECORD.fields[f][0].str, _RECORD.fields[f][1]) for f in _RECORD.names] == [
    ("<u8", 0), ("<u8", 8), ("<i8", 16), ("<u8", 24), ("<u8", 32), ("<u8", 40), ("<u8", 48), ("<u4", 56),
    ("<u4", 60), ("<u4", 64), ("<u4", 68)] and _RECORD.itemsize == 72, "value_digest's layout changed"


def _host(x, dtype) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().reshape(-1).cpu().numpy()
    return np.ascontiguousarray(np.asarray(x).reshape(-1), dtype=dtype)


def _step_inputs(step, slot_mapping, request_ids, pad) -> tuple:
    """A step's slots (int64), request ids (uint64; 0 where none are given) and pad flags (None: the negative slots)
    on the host, refused where their lengths differ."""
    slots = _host(slot_mapping, np.int64)
    reqs = np.zeros(len(slots), np.uint64) if request_ids is None else _host(request_ids, np.uint64)
    pads = None if pad is None else _host(pad, bool)
    if len(reqs) != len(slots) or (pads is not None and len(pads) != len(slots)):
        raise ValueError(f"step {step}: {len(slots)} slots, {len(reqs)} request ids, "
                         f"{len(slots) if pads is None else len(pads)} pad flags")
    return slots, reqs, pads


class _Cache:
    """A watched cache: its slots as byte rows ``[num_slots, slot_bytes]`` (a view), its id and name."""

    def __init__(self, cache, *, name: str, cache_id: int, page_size: int, slot_bytes: int | None, source) -> None:
        self.tensor, self.name, self.cache_id, self.page_size = cache, name, cache_id, int(page_size)
        self.torch = is_torch(cache)
        nbytes = int(cache.numel()) * int(cache.element_size()) if self.torch else int(cache.nbytes)
        contiguous = cache.is_contiguous() if self.torch else cache.flags["C_CONTIGUOUS"]
        if not contiguous:
            raise ValueError(f"cache {name!r}: not contiguous")
        slots = int(cache.shape[0]) * self.page_size
        if slot_bytes is None:
            if slots <= 0 or nbytes % slots:
                raise ValueError(f"cache {name!r}: {nbytes} bytes do not split into {slots} slots of equal size")
            slot_bytes = nbytes // slots
        self.slot_bytes, self.num_slots = int(slot_bytes), nbytes // int(slot_bytes)
        flat = cache.reshape(-1)
        if self.torch:
            import torch

            flat = flat.view(torch.uint8)[: self.num_slots * self.slot_bytes]
        else:
            flat = flat.view(np.uint8)[: self.num_slots * self.slot_bytes]
        self.rows = flat.reshape(self.num_slots, self.slot_bytes)  # bytes per slot (a view)
        self.base = int(cache.data_ptr()) if self.torch else int(cache.ctypes.data)
        self.live_key = (self.num_slots, str(cache.device) if self.torch else None)  # caches sharing slot indices
        self.source = source

    def gather(self, slots):
        """The slots' rows (bytes ``[k, slot_bytes]``, a copy) of this cache."""
        return self.rows.index_select(0, slots) if self.torch else self.rows[slots]


def _pools(caches: list[_Cache]) -> list[tuple[list[_Cache], object]]:
    """The torch caches that share one storage and one slot width (two or more, int64-aligned): per storage, the
    caches and (flat int64 words of the storage, word offset of each cache's slot 0, words per slot, their arange),
    for one gather across all of them (the K and V caches of every layer as views of one pool, say)."""
    by = {}
    for c in caches:
        if c.torch and c.slot_bytes % 8 == 0:
            st = c.tensor.untyped_storage()
            by.setdefault((st.data_ptr(), str(c.tensor.device), c.slot_bytes), (st, []))[1].append(c)
    out = []
    for (ptr, _dev, sb), (st, cs) in by.items():
        offs = [c.base - ptr for c in cs]
        if len(cs) < 2 or any(o % 8 for o in offs) or st.nbytes() % 8:
            continue
        import torch

        try:  # the whole storage as int64 words (a view)
            flat = torch.empty(0, dtype=torch.uint8, device=cs[0].tensor.device).set_(st).view(torch.int64)
        except (RuntimeError, TypeError):  # pragma: no cover - a storage torch will not view: one gather per cache
            continue
        out.append((cs, (flat, torch.tensor([o // 8 for o in offs], dtype=torch.int64, device=flat.device),
                         sb // 8, torch.arange(sb // 8, device=flat.device))))
    return out


class ValueProbe(RecorderOwner):
    """Watches caches and records, per step, the digests of every mapped slot (see the module docstring).

    ``out``: a dump path (a :class:`~kvconv.capture.probe.writer.CanaryRecorder` is made for it) or a recorder
    shared with the location canary (one dump for both). ``before=False`` skips the digest of the slots before the
    step (cheaper; a slot not written then reads as a wrong value). ``timings``: per step, host ns spent by the probe
    before the step and after it (on the torch path the second includes waiting for the step's work on the device;
    the fused path does not wait: a step's digests are read, and its records made, at the next step, once that
    step's launches are queued, or when the recorder closes, and counted in that step's second figure). ``fused``: the
    Triton path for torch CUDA caches (module docstring): None where it applies and triton imports, unless the
    environment has KVCONV_VALUE_FUSED=0 (read here); False never; True where it applies, an error without triton.
    The records are the same either way; ``fused_steps`` counts the steps it took. ``graphs``: on the fused path,
    the slots' digests before and after the step by one CUDA graph replay each (made at the first step and again
    when a step maps more slots than it holds; the host writes the slots into pinned memory and reads the digests
    out of it), instead of a Triton launch each, whose host work before the replay would add to every step; False,
    or KVCONV_VALUE_GRAPHS=0 in the environment: launches.
    """

    def __init__(self, out, *, metadata: dict | None = None, context_id: int = 0, device_id: int = 0,
                 before: bool = True, fused: bool | None = None, graphs: bool = True) -> None:
        if isinstance(out, (str, os.PathLike)):
            out = CanaryRecorder(out, context_id=context_id, device_id=device_id, metadata=metadata)
        self.recorder = out
        self.before = before
        self.fused = False if fused is None and os.environ.get("KVCONV_VALUE_FUSED") == "0" else fused
        self.graphs = graphs and os.environ.get("KVCONV_VALUE_GRAPHS") != "0"
        self.fused_steps = 0
        self._fused_dev = None  # (device or None) once decided for the watched caches
        self._fused = None  # (FusedBuffers, slot_groups, row plans, slot graphs' maker or None), with _fused_dev
        self.caches: list[_Cache] = []
        self._reps: list[_Cache] = []  # see watch
        self._sourced: list[_Cache] = []
        self._slot_bytes = np.zeros(0, np.int64)
        self._words = np.empty((9, 0), "<u8")  # _record's scratch
        self.timings: list[tuple[int, int]] = []
        self._expect: dict[int, tuple[int, object]] = {}  # cache id -> (step, rows)
        self._step: int | None = None
        self._plan = None  # _pools of the watched caches
        self._by_name: dict[str, _Cache] = {}
        self._pending = None  # the last fused step, its records not made yet (_flush)
        out.add_flusher(self._flush)
        self.steps = 0

    def watch(self, cache, *, name: str, page_size: int, slot_bytes: int | None = None, source=None) -> int:
        """Watch a KV cache shaped ``[num_pages, page_size, ...]`` (contiguous; numpy or torch): slot ``s`` is its
        ``s``-th row of ``slot_bytes`` (default: its bytes over ``num_pages * page_size``). ``source``: the tensor
        of rows the kernel writes from (``[tokens, ...]``, one row per token of a step), digested before each step
        where no rows are given. Returns the cache id its records carry."""
        if any(c.name == name for c in self.caches):
            raise ValueError(f"cache {name!r} is watched already")
        c = _Cache(cache, name=name, cache_id=len(self.caches), page_size=page_size, slot_bytes=slot_bytes,
                   source=source)
        self.caches.append(c)
        self._slot_bytes = np.array([x.slot_bytes for x in self.caches], np.int64)  # by cache id, for _record
        self._by_name[name] = c
        self._plan = self._fused_dev = self._fused = None
        self._reps = list({x.live_key: x for x in self.caches}.values())  # a cache per live key
        self._sourced = [x for x in self.caches if x.source is not None]
        self.recorder.add_cache(cache_id=c.cache_id, name=name, base=c.base, size=c.num_slots * c.slot_bytes,
                                slot_bytes=c.slot_bytes, page_size=c.page_size)
        return c.cache_id

    def _cache(self, which) -> _Cache:
        c = self._by_name.get(which) if isinstance(which, str) else None
        if c is None and isinstance(which, int) and 0 <= which < len(self.caches):
            c = self.caches[which]
        if c is None:
            c = next((x for x in self.caches if which is x.tensor), None)
        if c is None:
            raise KeyError(f"no watched cache {which!r}")
        return c

    def expect_values(self, step: int, cache, rows) -> None:
        """The rows the engine means ``step`` to write into ``cache`` (its name, id or tensor): ``[tokens, ...]``,
        row ``i`` for token ``i`` of the step's slot mapping, each row as many bytes as a slot (the cache's dtype).
        Call before the step's block ends."""
        c = self._cache(cache)
        self._expect[c.cache_id] = (int(step), rows)

    @contextlib.contextmanager
    def step(self, step: int, slot_mapping, request_ids=None, *, pad=None, expect: dict | None = None, eager=None):
        """Record one step around its launches: token ``i`` maps to ``slot_mapping[i]`` for request
        ``request_ids[i]``; ``pad`` marks padding rows (default: negative slots), which are not checked.
        ``expect``: {cache name: rows} as :meth:`expect_values`; ``eager``: a callable run before the step on
        copies of the watched caches (a dict name -> copy), whose written slots are then the expected rows."""
        slots, reqs, pads = _step_inputs(step, slot_mapping, request_ids, pad)
        self._step = st = int(step)
        for name, rows in (expect or {}).items():  # as expect_values (inline: 80 caches a step)
            c = self._by_name.get(name) if isinstance(name, str) else None
            self._expect[(c or self._cache(name)).cache_id] = (st, rows)
        t0 = time.perf_counter_ns()
        dev = self._fused_device() if eager is None else None
        memo: dict = {}
        for c in self._reps:  # the checked tokens, once per live key
            self._live(c, slots, pads, memo, dev is None)
        run = live = None  # the fused path lists every cache's tokens after the replay is queued
        if dev is not None:
            capacity = 4 * sum(len(cids) * len(memo[key][0]) for key, _sb, cids, _b in self._fused[1])
            run = fused.FusedStep(fused.kernel(), self._fused[0], capacity, self.fused_steps % 2)
            chunks = self._fused_before(run, memo, slots)
        else:
            live = [(c, memo[c.live_key]) for c in self.caches]
            chunks = self._before(live, eager)
        t1 = time.perf_counter_ns()
        try:
            yield self
        except BaseException:
            self._expect.clear()
            self._step = None
            raise
        t2 = time.perf_counter_ns()
        if live is None:
            live = [(c, memo[c.live_key]) for c in self.caches]
        exp = self._expect
        given = [(c, e[1], tok) for c, (tok, _i) in live if (e := exp.get(c.cache_id)) is not None and e[0] == st]
        cols = None
        if run is None:
            chunks["after"] = self._gather(live)
            chunks["given"] = self._rows_words(given)
            host = read_back(digest_all(chunks))  # the step's one digest pass and one synchronisation
            self._flush()
            cols = self._columns(live, host)
        elif self._fused_after(run, memo, slots, given, chunks):
            self._flush()  # the step before's records, while this step runs on the device
            # this step's: at the next step or at close (the rows given stay referenced until their digests are read)
            self._pending = (run, st, slots, reqs, live, chunks, time.monotonic_ns(), given)
        else:
            self._flush()
            cols = self._fused_columns(run, live, chunks)
        if cols is not None:
            self._record(st, slots, reqs, *cols, host_ns=time.monotonic_ns())
        self._expect.clear()
        self._step = None
        self.steps += 1
        self.fused_steps += run is not None
        self.timings.append((t1 - t0, time.perf_counter_ns() - t2))

    def _before(self, live, eager) -> dict:
        """The torch/numpy path before the step: only copies are taken (the slots, the source rows, the eager run's
        slots); every digest of the step is made after it, in one pass."""
        chunks: dict = {"before": self._gather(live) if self.before else []}
        chunks["source"] = self._rows_words([(c, c.source, tok) for c, (tok, _) in live if c.source is not None])
        chunks["eager"] = []
        if eager is not None:
            copies = {c.name: (c.tensor.clone() if c.torch else c.tensor.copy()) for c in self.caches}
            eager(copies)
            chunks["eager"] = word_chunks({c.cache_id: _Cache(copies[c.name], name=c.name, cache_id=c.cache_id,
                                                               page_size=c.page_size, slot_bytes=c.slot_bytes,
                                                               source=None).gather(idx) for c, (_, idx) in live})
        return chunks

    def _fused_device(self):
        """The CUDA device of the watched caches where the fused path applies to them (decided once), else None."""
        if self._fused_dev is None:
            cs, dev = self.caches, False
            if self.fused is not False and cs and all(c.torch and c.tensor.is_cuda and c.slot_bytes % 8 == 0
                                                      and c.base % 8 == 0 for c in cs):
                devs = {c.tensor.device for c in cs}
                if len(devs) == 1 and fused.kernel() is not None:
                    dev = devs.pop()
                elif len(devs) == 1 and self.fused:
                    raise RuntimeError("ValueProbe(fused=True): triton cannot be imported")
            self._fused_dev = dev
            if dev:
                self._fused = (fused.FusedBuffers(dev), fused.slot_groups(cs), {},
                               fused.slot_graphs() if self.graphs else None)
        return self._fused_dev or None

    def _fused_before(self, run: fused.FusedStep, memo: dict, slots: np.ndarray) -> dict:
        """Before the step: a graph replay (or a launch) digests the checked slots (unless ``before=False``), a
        launch the source rows in place; source rows the kernel cannot address are copied for the torch path
        (returned as chunks)."""
        _bufs, groups, layouts, graphs = self._fused
        if self.before:
            run.slots("before", groups, memo, slots, graphs)
        src = [(c, c.source, memo[c.live_key][0]) for c in self._sourced]
        slow = fused.queue_rows(run, "source", src, layouts) if src else []
        run.launch("before")
        return {"source": self._rows_words(slow)}

    def _fused_after(self, run: fused.FusedStep, memo: dict, slots: np.ndarray, given: list, chunks: dict) -> bool:
        """After the step: a graph replay (or a launch) over the slots, a launch over the given rows, the copy back
        queued. Rows the kernel cannot address go the torch path (into ``chunks``). Returns whether the kernels made
        every digest of the step (then the records can wait for the next step: :meth:`_flush`)."""
        _bufs, groups, layouts, graphs = self._fused
        run.slots("after", groups, memo, slots, graphs)
        chunks["given"] = self._rows_words(fused.queue_rows(run, "given", given, layouts))
        run.launch("after")
        run.queue_read()
        return not any(chunks.values())

    def _fused_columns(self, run: fused.FusedStep, live, chunks: dict):
        """The records' columns of a fused step (waiting for its copy back): straight from the kernel's blocks
        where they allow, else per cache, with the torch path's digests of ``chunks`` merged in."""
        blocks = run.blocks()
        if not any(chunks.values()):
            cols = fused.columns_from_blocks(blocks, self.before)
            if cols is not None:
                return cols
        host = fused.per_cache(blocks)
        if any(chunks.values()):
            for tag, got in read_back(digest_all(chunks)).items():
                host[tag].update(got)
        return self._columns(live, host)

    def _flush(self) -> None:
        """Make the records of the fused step left pending (the last one, if its digests all came from the
        kernel): called at the next step, once that step's launches are queued, so that this host work overlaps
        the device's, and when the recorder closes. Keeps the records in step order."""
        pending, self._pending = self._pending, None
        if pending is not None:
            run, step, slots, reqs, live, chunks, ns, _given = pending
            cols = self._fused_columns(run, live, chunks)
            if cols is not None:
                self._record(step, slots, reqs, *cols, host_ns=ns)

    def _live(self, c: _Cache, slots: np.ndarray, pads: np.ndarray | None, memo: dict, index: bool = True):
        """Token indices (host) of the step's checked rows in cache ``c`` and their slots (on the cache's device;
        not for the fused path: ``index=False``, None), made once per step for every cache of one size on one
        device."""
        key = c.live_key
        if key not in memo:
            ok = slots.view(np.uint64) < c.num_slots  # a negative slot reads as one past every cache's
            tok = np.flatnonzero(ok if pads is None else ok & ~pads)
            if not index:
                memo[key] = tok, None
            elif c.torch:
                import torch

                memo[key] = tok, torch.as_tensor(slots[tok], dtype=torch.int64).to(c.tensor.device, non_blocking=True)
            else:
                memo[key] = tok, slots[tok]
        return memo[key]

    def _gather(self, live) -> list[tuple[list, object, int]]:
        """Every cache's slots of the step as word chunks (copies): torch caches sharing one storage in one
        gather, the others one gather each."""
        if self._plan is None:  # which caches share a storage: found once
            self._plan = _pools(self.caches)
        where = dict(live)
        out, done = [], set()
        for cs, (flat, base, w, words) in self._plan:
            toks = [where[c][0] for c in cs]
            if len({len(t) for t in toks}) != 1 or not len(toks[0]):
                continue
            import torch

            i0 = where[cs[0]][1]
            if all(where[c][1] is i0 for c in cs):  # caches of one size: one slot index for all (no copy)
                idx = i0.unsqueeze(0).expand(len(cs), -1)
            else:
                idx = torch.stack([where[c][1] for c in cs])  # [C, k] slots
            at = (base[:, None, None] + idx[:, :, None] * w + words).reshape(-1)
            out.append(([c.cache_id for c in cs], flat.index_select(0, at).reshape(-1, w), len(toks[0])))
            done.update(c.cache_id for c in cs)
        out += word_chunks({c.cache_id: c.gather(idx) for c, (_t, idx) in live if c.cache_id not in done})
        return out

    def _rows_words(self, items) -> list[tuple[list, object, int]]:
        """The rows handed over for caches (``items``: (cache, rows [tokens, ...], checked tokens)) as word chunks:
        the rows of one shape and dtype on one device stacked (a copy), the checked tokens taken (per cache only the
        references are collected: a step's 80 caches cost one stack)."""
        groups: dict = {}
        for c, rows, tok in items:
            t = is_torch(rows)
            key = (t, rows.device if t else None, rows.dtype, rows.shape, c.slot_bytes, id(tok))
            g = groups.setdefault(key, ([], [], tok))
            g[0].append(c)
            g[1].append(rows)
        out = []
        for (t, _dev, _dt, shape, sb, _id), (cs, rl, tok) in groups.items():
            n, k = int(shape[0]), len(tok)
            fused.check_rows(cs[0], rl[0], tok)
            if not k:
                out.append(([c.cache_id for c in cs], None, 0))
                continue
            if t:
                import torch

                st = torch.stack(rl)  # [G, n, ...], contiguous (strided rows, a QKV output's K columns, are fine)
                if k != n:
                    st = st.index_select(1, torch.as_tensor(tok, dtype=torch.int64).to(st.device))
                b = st.view(torch.uint8).reshape(len(cs) * k, sb)
            else:
                st = np.stack([np.asarray(r) for r in rl])
                b = np.ascontiguousarray(st if k == n else st[:, tok]).view(np.uint8).reshape(len(cs) * k, sb)
            out.append(([c.cache_id for c in cs], row_words(b), k))
        return out

    def _columns(self, live, host: dict):
        """The records' columns from per-cache digests: expected from the rows given, else the eager reference,
        else the source tensor; a cache with none of them is not checked. (cache ids, tokens, expected, actual,
        before or None, flags), or None where no cache is checked."""
        order = [("given", FLAGS["given"]), ("eager", FLAGS["eager"]), ("source", FLAGS["source"])]
        picked = []
        for c, (tok, _idx) in live:
            for tag, flag in order:
                if c.cache_id in host[tag]:
                    picked.append((c, tok, host[tag][c.cache_id], flag))
                    break
        if not picked:
            return None
        lens = [len(t) for _c, t, _e, _f in picked]
        before = np.concatenate([host["before"][c.cache_id] for c, *_x in picked]) if self.before else None
        return (np.repeat([c.cache_id for c, *_x in picked], lens), np.concatenate([t for _c, t, _e, _f in picked]),
                np.concatenate([e for *_x, e, _f in picked]),
                np.concatenate([host["after"][c.cache_id] for c, *_x in picked]), before,
                np.repeat([f for *_x, f in picked], lens))

    def _record(self, step, slots, reqs, cids, tok, expected, actual, before, flags, *, host_ns: int) -> None:
        """The step's value_digest records, one array (a record per checked token and cache, in cache order). The
        columns are written as rows of one [9, n] matrix of little-endian words (contiguous) and transposed into
        the records once: assigning 11 strided fields of 5,120 records one by one costs twice as much. The matrix
        is kept across steps (fresh memory costs its page faults, ~as much as the writes)."""
        n = len(tok)
        if self._words.shape[1] < n:
            self._words = np.empty((9, max(n, 2 * self._words.shape[1])), "<u8")
        m = self._words[:, :n]
        m[0], m[1] = int(step), host_ns
        m[2], m[3] = slots[tok].view(np.uint64), reqs[tok]
        m[4], m[5] = expected.view(np.uint64), actual.view(np.uint64)
        flags = np.asarray(flags, np.uint64)
        if before is not None:
            m[6] = before.view(np.uint64)
        else:
            m[6], flags = 0, flags | FLAGS["no_before"]
        m[7] = cids.astype(np.uint64) | (tok.astype(np.uint64) << np.uint64(32))  # cache_id, row: u4 each
        m[8] = self._slot_bytes[cids].astype(np.uint64) | (flags << np.uint64(32))  # row_bytes, flags
        r = np.ascontiguousarray(m.T).view(_RECORD).reshape(n)
        self.recorder.add_records("value_digest", r)
