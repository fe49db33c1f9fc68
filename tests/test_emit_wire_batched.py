"""`_wire.encode_batched` (the host launch records, node and kernel slices of the Perfetto trace, a batch of rows at
a time with only a layout id per row held) writes exactly the bytes of one encoding of all the rows, whatever the
batch size: rows of many layouts (varint lengths, optional fields and messages, repeated fixed64 counts) spread over
the batches, the layouts' order found batch by batch."""

from __future__ import annotations

import numpy as np
import pytest

from kvconv.emit import _wire as w


def _fields(rng, n):
    vals = rng.integers(0, 2**62, n, dtype=np.uint64) >> rng.integers(0, 62, n).astype(np.uint64)
    small = rng.integers(0, 300, n).astype(np.uint64)
    present = rng.random(n) < 0.7
    flows = rng.integers(0, 2**63, (n, 4), dtype=np.uint64)
    count = rng.integers(0, 5, n)

    def fields(i, full=True):
        ann = [w.msg(4, [w.const(b"\x08\x01"), w.varint(3, small[i])], present[i])]
        te = ann + [w.varint(10, vals[i]), w.rfixed64(47, flows[i] if full else flows[i][:, :0], count[i])]
        return [w.msg(1, [w.varint(8, vals[i] >> np.uint64(3)), w.msg(11, te), w.const(b"\x68\x02")])]

    return fields


@pytest.mark.parametrize("n,step", [(1000, 64), (1000, 999), (4096, 1000), (10, 3), (1, 1)])
def test_batches_give_the_bytes_of_one_encoding(n, step):
    fields = _fields(np.random.default_rng(n + step), n)
    whole = w.encode(fields(slice(0, n)), n)[0]
    batched = b"".join(bytes(p) for p in w.encode_batched(fields, n, step))
    assert batched == whole
    assert len(whole) > n  # not trivially empty
