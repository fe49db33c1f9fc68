"""The value probe's fused path (kvconv.capture.probe.fused and _digest_triton): its digests equal
``digest_rows``' (numpy) bit for bit, and a ValueProbe records the same with it as without (``fused=False``).

Needs torch with a CUDA device and triton: skipped elsewhere. Imports nothing from conftest, so it also runs where
the test extras are missing (``pytest -p no:cacheprovider --noconftest tests/test_value_digest_gpu.py``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("triton")

from kvconv.capture.probe.digest import digest_rows, row_bytes  # noqa: E402
from kvconv.capture.probe.fused import row_layout  # noqa: E402
from kvconv.capture.probe.values import ValueProbe  # noqa: E402
from kvconv.format import dump  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())
PAGE, NPAGES = 4, 16


def _random(shape, dtype, seed: int):
    """A CUDA tensor of random bytes (NaN patterns included: only bits are compared)."""
    size = torch.empty(0, dtype=dtype).element_size()
    n = int(np.prod(shape)) * size
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return torch.from_numpy(raw).to(DEV).view(dtype).reshape(shape)


def _reference(rows) -> np.ndarray:
    n = int(rows.shape[0])
    return digest_rows(rows.contiguous().cpu().view(torch.uint8).reshape(n, -1).numpy())


def _fused(rows) -> np.ndarray:
    from kvconv.capture.probe._digest_triton import digest_addresses

    at = row_layout(rows, rows.device)
    assert at is not None
    n = int(rows.shape[0])
    addrs = torch.tensor([at[0] + i * at[1] for i in range(n)], dtype=torch.int64, device=DEV)
    out = torch.full((n,), 7, dtype=torch.int64, device=DEV)
    digest_addresses(addrs, out, row_bytes(rows) // 8)
    return out.cpu().numpy()


@pytest.mark.parametrize("dtype,row", [(torch.bfloat16, (4,)), (torch.bfloat16, (8, 128)), (torch.float32, (1400,)),
                                       (torch.int8, (12000,)), (torch.int64, (3,)), (torch.float16, (3, 100))])
def test_fused_digest_equals_numpy_contiguous(dtype, row):
    rows = _random((37, *row), dtype, seed=len(row) * 1000 + row[-1])  # 12000 int8: 1500 words, two blocks
    assert (_fused(rows) == _reference(rows)).all()
    assert len(set(_fused(rows).tolist())) == 37


def test_fused_digest_equals_numpy_strided():
    qkv = _random((29, 512 + 2 * 128), torch.bfloat16, seed=3)
    for rows in (qkv[:, 512:640], qkv[:, 640:], qkv.view(29, 6, 128)[:, 4:6], qkv[3:20:2, 4:12]):
        assert row_layout(rows, DEV) is not None
        assert (_fused(rows) == _reference(rows)).all()
    for rows in (qkv[:, 1:9], qkv.view(29, 6, 128)[:, :, :64], qkv[:, :128].t(), qkv.cpu()[:, :8]):
        assert row_layout(rows, DEV) is None  # unaligned, gaps within a row, transposed, on the host


def test_slot_graph_digests_equal_numpy():
    """SlotDigests: three groups (two caches of 16-byte slots, one of 24, one whose step maps nothing), replayed
    for steps of different slots within its room: each replay's digests are numpy's of the slots' rows."""
    from kvconv.capture.probe._digest_triton import SlotDigests

    caches = [_random((NPAGES, PAGE, 8), torch.bfloat16, seed=i) for i in range(2)]
    caches += [_random((NPAGES, PAGE, 12), torch.bfloat16, seed=7), _random((NPAGES, PAGE, 8), torch.bfloat16, 9)]
    groups = [(np.array([0, 1]), np.array([c.data_ptr() for c in caches[:2]], np.int64), 16),
              (np.array([2]), np.array([caches[2].data_ptr()], np.int64), 24),
              (np.array([3]), np.array([caches[3].data_ptr()], np.int64), 16)]
    graph = SlotDigests(DEV, groups, [8, 8, 4])
    for slots in ([np.array([3, 0, 63, 17]), np.array([5, 5]), np.array([], np.int64)],
                  [np.arange(8) * 7, np.array([1]), np.array([], np.int64)]):
        assert graph.fits([len(x) for x in slots])
        got = graph.run(slots)
        graph.event.synchronize()
        for (cids, _b, sb), s, m in zip(groups, slots, got):
            assert m.shape == (len(cids), len(s))
            for row, cid in zip(m, cids if len(s) else []):
                assert (row == _reference(caches[cid].reshape(-1, sb // 2)[torch.as_tensor(s, device=DEV)])).all()
    assert not graph.fits([9, 1, 0])


def _records(path) -> np.ndarray:
    with dump.open(path) as d:
        return d.records("value_digest")


def _assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert len(a) == len(b) and len(a)
    for field in a.dtype.names:
        if field != "host_ns":
            assert (a[field] == b[field]).all(), field


def _caches(kind: str):
    if kind == "pooled":
        return list(torch.zeros(4, NPAGES, PAGE, 8, dtype=torch.bfloat16, device=DEV))
    if kind == "apart":
        return [torch.zeros(NPAGES, PAGE, 8, dtype=torch.bfloat16, device=DEV) for _ in range(4)]
    # two widths (16 and 24 bytes a slot: two launches a phase) and a smaller cache (its own checked tokens)
    return [torch.zeros(NPAGES, PAGE, 8, dtype=torch.bfloat16, device=DEV),
            torch.zeros(NPAGES, PAGE, 12, dtype=torch.bfloat16, device=DEV),
            torch.zeros(NPAGES // 2, PAGE, 8, dtype=torch.bfloat16, device=DEV),
            torch.zeros(NPAGES, PAGE, 3, dtype=torch.float64, device=DEV)]


def _run_both(tmp_path, kind: str, *, before: bool = True, eager_step: int | None = None, raise_step: int = -1,
              graphs: bool = True):
    """Four steps with a fused and an unfused probe nested around each (both see the same slots); returns their
    records and the probes. Cache 0 gets a wrong row, cache 1 its rows from the host (the torch path within a fused
    step), cache 2 unaligned rows (likewise), cache 3 its rows from a source tensor; slot 8 is never written.
    Step ``raise_step`` raises inside both blocks after its writes (no records; its copies may be left pending).
    ``graphs``: the fused probe's slots by CUDA graph replays (else by Triton launches)."""
    caches = _caches(kind)
    width = [int(c.shape[-1]) for c in caches]
    src = torch.zeros(6, width[3], dtype=caches[3].dtype, device=DEV)
    probes = [ValueProbe(tmp_path / f"{kind}.{f}.kvdump", before=before, fused=f, graphs=graphs) for f in (None, False)]
    for vp in probes:
        for i, c in enumerate(caches):
            vp.watch(c, name=f"c{i}", page_size=PAGE, source=src if i == 3 else None)
    for step in range(4):
        slots = torch.tensor([8, 20 + step, -1, 33 + step, 40, 9], device=DEV)
        qkv = [_random((6, 3 * w), c.dtype, seed=100 * step + i) for i, (c, w) in enumerate(zip(caches, width))]
        rows = [q[:, w:2 * w] for q, w in zip(qkv, width)]
        rows[2] = qkv[2][:, 1:1 + width[2]]
        src.copy_(_random(tuple(src.shape), src.dtype, seed=100 * step + 9))
        expect = {"c0": rows[0], "c1": rows[1].cpu(), "c2": rows[2]}
        eager = None
        if step == eager_step:
            def eager(copies, slots=slots, rows=rows):
                for i in range(3):
                    flat = copies[f"c{i}"].view(-1, width[i])
                    ok = (slots >= 0) & (slots < flat.shape[0]) & (slots != 8)
                    flat[slots[ok]] = rows[i][ok]
            expect = {}
        with (contextlib.suppress(RuntimeError),
              probes[0].step(step, slots, list(range(6)), expect=expect, eager=eager),
              probes[1].step(step, slots, list(range(6)), expect=expect, eager=eager)):
            for i, c in enumerate(caches):
                flat = c.view(-1, width[i])
                ok = (slots >= 0) & (slots < flat.shape[0]) & (slots != 8)
                new = (src if i == 3 else rows[i]).clone()
                if i == 0:
                    new.view(torch.uint8)[3, 0] ^= 1  # one bit of token 3's row
                flat[slots[ok]] = new[ok]
            if step == raise_step:
                raise RuntimeError("the engine failed")
    for vp in probes:
        vp.close()
    return [_records(vp.recorder.path) for vp in probes], probes


def _graphs(probe) -> dict:
    """The fused probe's slot graphs by name (none where its slots went by launches)."""
    bufs = probe._fused[0]
    assert not bufs.no_graphs
    return bufs.graphs


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("kind", ["pooled", "apart", "mixed"])
def test_probe_records_equal_the_torch_path(tmp_path, kind, graphs):
    (fused, plain), (pf, pp) = _run_both(tmp_path, kind, graphs=graphs)
    assert (pf.fused_steps, pp.fused_steps) == (4, 0)
    assert sorted(_graphs(pf)) == (["after0", "after1", "before0", "before1"] if graphs else [])
    _assert_same(fused, plain)
    wrong = fused[fused["expected"] != fused["actual"]]
    assert sorted({(int(r["cache_id"]), int(r["slot"])) for r in wrong if r["slot"] != 8}) == \
        [(0, 33 + s) for s in range(4)]
    assert (wrong["slot"] == 8).sum() == 4 * 4  # never written, every cache, every step
    assert (fused["before"] != fused["actual"]).any()


def test_probe_without_before_and_with_an_eager_step(tmp_path):
    (fused, plain), (pf, pp) = _run_both(tmp_path, "pooled", before=False, eager_step=2)
    assert (pf.fused_steps, pp.fused_steps) == (3, 0)  # the eager step takes the torch path
    _assert_same(fused, plain)


def test_odd_slot_widths_keep_the_torch_path(tmp_path):
    out = []
    for f in (None, False):
        # a fresh cache per probe: these two run one after the other, not nested, so with one cache the second
        # probe's "before" would read the rows the first run wrote (its H200 failure: before = digest of the rows
        # for the second, of zeros for the first; both right)
        cache = torch.zeros(NPAGES, PAGE, 3, dtype=torch.bfloat16, device=DEV)  # 6 bytes a slot
        vp = ValueProbe(tmp_path / f"odd.{f}.kvdump", fused=f)
        vp.watch(cache, name="c", page_size=PAGE)
        rows = _random((3, 3), torch.bfloat16, seed=1)
        with vp.step(0, [5, 6, 7], expect={"c": rows}):
            cache.view(-1, 3)[5:8] = rows
        vp.close()
        assert vp.fused_steps == 0
        out.append(_records(vp.recorder.path))
    _assert_same(*out)


def test_rows_that_do_not_fit_are_refused_alike(tmp_path):
    messages = []
    for f in (None, False):
        vp = ValueProbe(tmp_path / f"bad.{f}.kvdump", fused=f)
        vp.watch(torch.zeros(NPAGES, PAGE, 8, dtype=torch.bfloat16, device=DEV), name="c", page_size=PAGE)
        with pytest.raises(ValueError) as e, vp.step(0, [5, 6, 7], expect={"c": _random((2, 8), torch.bfloat16, 1)}):
            pass
        messages.append(str(e.value))
        vp.close()
    assert messages[0] == messages[1] and "2 rows given" in messages[0]


def test_buffers_kept_across_steps(tmp_path):
    """The fused path's pinned and device buffers are reused step after step, grown when a step maps more tokens
    (here from 6 a step to 600: past the first size) and still right after a step that raised: the records equal
    the torch path's, and "before" changes from one step to the next as the slots were written."""
    (fused, plain), (pf, _pp) = _run_both(tmp_path, "mixed", raise_step=1)
    assert pf.fused_steps == 3 and set(fused["step"].tolist()) == {0, 2, 3}
    _assert_same(fused, plain)
    out = []
    for f in (None, False):
        cache = torch.zeros(NPAGES * 32, PAGE, 8, dtype=torch.bfloat16, device=DEV)  # 2048 slots
        vp = ValueProbe(tmp_path / f"grow.{f}.kvdump", fused=f)
        vp.watch(cache, name="c", page_size=PAGE)
        for step, n in enumerate((6, 600, 6, 600)):
            slots = torch.arange(n, device=DEV) * 2 + step % 2  # steps 2, 3 rewrite the slots of 0, 1
            rows = _random((n, 8), torch.bfloat16, seed=step)
            with vp.step(step, slots, expect={"c": rows}):
                cache.view(-1, 8)[slots] = rows
        vp.close()
        assert vp.fused_steps == (4 if f is None else 0)
        if f is None:  # the odd steps' slot graphs made again for 600 slots: room for 1024 (from 64)
            assert {k: g.caps for k, g in _graphs(vp).items()} == {f"{p}{i}": [64 if i == 0 else 1024]
                                                                    for p in ("before", "after") for i in (0, 1)}
        out.append(_records(vp.recorder.path))
    _assert_same(*out)
    r = out[0]
    assert (r["expected"] == r["actual"]).all()
    first = r[(r["step"] == 2)]["before"]
    assert (first == r[(r["step"] == 0)]["actual"]).all()  # step 2's before: what step 0 wrote there
