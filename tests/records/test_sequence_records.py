"""parse_sequence_example against SequenceExamples built by protobuf."""

from __future__ import annotations

import pytest
from tensorflow.core.example import example_pb2

from recordforge.records.sequence_records import parse_sequence_example


def test_context_and_feature_lists_with_empty_steps() -> None:
    seq = example_pb2.SequenceExample()
    seq.context.feature["user"].bytes_list.value.append(b"u\xff")
    seq.context.feature["n"].int64_list.value.extend([0, -1])
    ts = seq.feature_lists.feature_list["ts"]
    for v in (3, 2**40):
        ts.feature.add().int64_list.value.append(v)
    pages = seq.feature_lists.feature_list["page"]
    pages.feature.add().bytes_list.value.extend([b"", b"a"])
    pages.feature.add().bytes_list.SetInParent()  # a null step: an empty list
    seq.feature_lists.feature_list["dwell"].feature.add().float_list.value.append(0.5)
    context, lists = parse_sequence_example(seq.SerializeToString(deterministic=True))
    assert context == {"user": ("bytes", [b"u\xff"]), "n": ("int64", [0, -1])}
    assert lists == {
        "ts": ("int64", [[3], [2**40]]),
        "page": ("bytes", [[b"", b"a"], []]),
        "dwell": ("float", [[0.5]]),
    }


def test_refuses_what_is_not_a_sequence_example() -> None:
    with pytest.raises(ValueError):
        parse_sequence_example(b"\x12\x05\x08\x01")
