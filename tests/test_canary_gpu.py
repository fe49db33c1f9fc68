"""The location canary on a real CUDA-graph replay (bench/canary_gpu.py): the planted pages, exactly, per case."""

from __future__ import annotations

import pytest

from conftest import ROOT, load_script

pytestmark = pytest.mark.gpu


def _bench():
    return load_script(ROOT / "bench" / "canary_gpu.py", "canary_gpu")


@pytest.mark.parametrize("case", ["clean", "stale-pad", "pad-minus-one"])
def test_canary_flags_exactly_the_planted_pages(case, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    r = _bench().run_case(case, str(tmp_path), "cuda", True)
    assert r["exact"], r
    if case == "clean":
        assert r["planted"] == {} and r["reported_unexpected"] == {}
    else:
        assert r["planted"], r
