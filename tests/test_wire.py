"""The numpy tf.train.Example decoder against protobuf, on canonical and unusual layouts."""

from __future__ import annotations

import numpy as np

from recordforge.tools._example_pb import Example
from recordforge.tools.records import parse_example
from recordforge.tools.wire import KeyTable, as_python, decode_batch


def _examples() -> list[bytes]:
    out = []
    rng = np.random.default_rng(0)
    for i in range(200):
        ex = Example()
        f = ex.features.feature
        f["id"].int64_list.value.append(int(rng.integers(-(2**62), 2**62)))
        f["xy"].float_list.value.extend([float(i), i + 0.5])
        f["name"].bytes_list.value.extend([b"n%d" % i] * (i % 3))
        if i % 4:
            f["long_feature_name_that_is_wider_than_a_word"].int64_list.value.extend(range(i % 5))
        if i % 7 == 0:
            f["empty"].SetInParent()  # a Feature with no list: kind none
        out.append(ex.SerializeToString())
    # Not the canonical layout: an unpacked int64 list (protobuf accepts it) and garbage.
    unpacked = b"\n\x0e\n\x0c\n\x02id\x12\x06\x1a\x04\x08\x05\x08\x07"
    out += [unpacked, b"\xff\xff\xff"]
    return out


def test_decoder_matches_protobuf() -> None:
    records = _examples()
    data = b"".join(records)
    lengths = np.array([len(r) for r in records])
    starts = np.cumsum(lengths) - lengths
    batch = decode_batch(data, starts, starts + lengths, KeyTable())
    assert batch.not_examples == [len(records) - 1]
    for r, raw in enumerate(records[:-1]):
        want = parse_example(raw)
        got = {}
        for name, col in batch.columns.items():
            for i in np.flatnonzero(col.rec == r).tolist():
                got[name] = as_python(col, i)
        assert got == want, r
