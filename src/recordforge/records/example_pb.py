"""tf.train.Example's messages from a descriptor, in a private pool: parsing without TensorFlow."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Example", "Feature", "parse_example"]

_F = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="recordforge/example.proto", package="recordforge.wire", syntax="proto3"
    )

    def message(name: str, fields: list[tuple[str, int, int, int, str | None, bool]]) -> None:
        msg = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name, packed in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if packed:
                f.options.packed = True

    rep, opt = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
    message("BytesList", [("value", 1, _F.TYPE_BYTES, rep, None, False)])
    message("FloatList", [("value", 1, _F.TYPE_FLOAT, rep, None, True)])
    message("Int64List", [("value", 1, _F.TYPE_INT64, rep, None, True)])
    feature = fd.message_type.add(name="Feature")
    for i, (fname, tname) in enumerate(
        [("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")]
    ):
        feature.field.add(
            name=fname,
            number=i + 1,
            type=_F.TYPE_MESSAGE,
            label=opt,
            type_name=f".recordforge.wire.{tname}",
            oneof_index=0,
        )
    feature.oneof_decl.add(name="kind")
    features = fd.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=opt)
    entry.field.add(
        name="value", number=2, type=_F.TYPE_MESSAGE, label=opt, type_name=".recordforge.wire.Feature"
    )
    features.field.add(
        name="feature",
        number=1,
        type=_F.TYPE_MESSAGE,
        label=rep,
        type_name=".recordforge.wire.Features.FeatureEntry",
    )
    message("Example", [("features", 1, _F.TYPE_MESSAGE, opt, ".recordforge.wire.Features", False)])
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
Example = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("recordforge.wire.Example"))
Feature = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("recordforge.wire.Feature"))


def parse_example(raw: bytes) -> dict[str, tuple[str, list[Any]]]:
    """{feature: (kind, values)} with kind "int64", "float" or "bytes", using protobuf only."""

    ex = Example.FromString(raw)
    out: dict[str, tuple[str, list[Any]]] = {}
    for name, feat in ex.features.feature.items():
        kind = feat.WhichOneof("kind")
        if kind is None:
            out[name] = ("none", [])
        else:
            out[name] = (
                {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}[kind],
                list(getattr(feat, kind).value),
            )
    return out
