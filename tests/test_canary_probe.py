"""kvconv.capture.probe on torch CPU tensors (skipped where torch is not installed, as in CI); the GPU run is
tests/test_canary_gpu.py."""

from __future__ import annotations

import pytest

from kvconv.check import canary
from kvconv.format import dump

torch = pytest.importorskip("torch")

from kvconv.capture.probe import Canary, expected_pages  # noqa: E402  (imports torch: after the skip)

DTYPES = [torch.bfloat16, torch.float32, getattr(torch, "float8_e4m3fn", torch.uint8)]


def test_expected_pages_drops_pads():
    locs = torch.tensor([-1, 0, 255, 256, 1000, 16 * 256, 5])
    assert expected_pages(locs, 256, 16).tolist() == [0, 1, 3]


@pytest.mark.parametrize("mode", ["clone", "checksum"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pages_that_change_are_found(tmp_path, mode, dtype):
    buf = torch.randn(16, 512).to(dtype)
    path = tmp_path / "p.kvdump"
    with Canary(path, metadata={"producer": "test"}) as can:
        can.watch(buf, name="kv", page_size=64, compression=4, excluded=[0], mode=mode)
        with can.step(0, torch.tensor([3 * 256 + 7, -1])):
            buf.view(torch.uint8)[3, 0] ^= 1
            buf.view(torch.uint8)[9, -1] ^= 0x80
            buf.view(torch.uint8)[0, 5] ^= 2
        (r,) = can.last
        assert r.changed.tolist() == [0, 3, 9] and r.unexpected.tolist() == [9] and r.missing.tolist() == []
        with can.step(1, [5 * 256]):
            pass
        assert can.last[0].missing.tolist() == [5]
    with dump.open(path) as d:
        res = canary.check(d)
    assert [(s["step"], s["unexpected"], s["missing"], s["snapshot"]) for s in res.steps] == [
        (0, [9], [], mode), (1, [], [5], mode)]


def test_bits_not_values_are_compared():
    buf = torch.zeros(4, 8, dtype=torch.float32)
    buf[2] = float("nan")
    can = Canary(_NullRecorder())
    can.watch(buf, name="f", page_size=2, compression=1, excluded=[])
    can.snapshot()
    buf[1, 3] = -0.0  # equal as a float, different bits
    (r,) = can.compare(0, [], record=False)
    assert r.changed.tolist() == [1]  # the NaN page does not read as changed


def test_checksum_chunks_and_odd_page_sizes():
    buf = torch.randint(0, 255, (33, 6), dtype=torch.uint8)  # 6-byte pages: int16 words
    can = Canary(_NullRecorder(), chunk_bytes=64)
    wb = can.watch(buf, name="u8", page_size=1, compression=1, mode="checksum", excluded=[])
    assert wb.words.dtype == torch.int16 and wb._chunk_pages < 33
    can.snapshot()
    buf[32, 5] += 1
    assert can.compare(0, [], record=False)[0].changed.tolist() == [32]


def test_auto_mode_and_bad_buffers():
    can = Canary(_NullRecorder(), clone_limit_bytes=32)
    assert can.watch(torch.zeros(4, 4), name="a", page_size=1).mode == "checksum"
    assert can.watch(torch.zeros(2, 4), name="b", page_size=1).mode == "clone"
    with pytest.raises(ValueError):
        can.watch(torch.zeros(2, 2, 2), name="c", page_size=1)
    with pytest.raises(ValueError):
        can.watch(torch.zeros(4, 4).t(), name="d", page_size=1)
    with pytest.raises(ValueError):
        can.watch(torch.zeros(4, 4), name="e", page_size=1, mode="fast")
    with pytest.raises(RuntimeError):
        can.compare(0, [])


class _NullRecorder:
    def add(self, **kw):
        pass

    def close(self):
        pass

    def __exit__(self, *a):
        pass

