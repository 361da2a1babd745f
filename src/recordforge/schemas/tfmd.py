"""Reading a TFMD Schema (schema.pbtxt from TFDV or SchemaGen) as a RecordForge schema."""

from __future__ import annotations

from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from recordforge.errors import SchemaError
from recordforge.files import layout
from recordforge.schemas.kinds import RAGGED, VARIABLE, DType, NullPolicy
from recordforge.schemas.model import Feature, Schema

__all__ = ["schema_from_tfmd", "schema_from_tfmd_text"]


def schema_from_tfmd_text(text: str, *, origin: str = layout.SCHEMA_PBTXT) -> Schema:
    try:
        proto = text_format.Parse(text, schema_pb2.Schema())
    except text_format.ParseError as exn:
        raise SchemaError(f"{origin}: not a TFMD Schema text proto: {exn}") from exn
    return schema_from_tfmd(proto, origin=origin)


def schema_from_tfmd(proto: schema_pb2.Schema, *, origin: str = layout.SCHEMA_PBTXT) -> Schema:
    """INT -> int64 (bool with a bool_domain), FLOAT -> float32, BYTES -> string with a
    string_domain (its own, or a shared one it names) or a `utf8` tag, else bytes. A FixedShape
    gives the shape; a value_count with min == max a fixed list; anything else a variable-length
    list. min_fraction 1 -> required. A ragged tensor representation (one feature partitioned by
    row lengths, as RecordForge and tensorflow-transform write it) is a ragged feature."""
    problems: list[str] = []
    features = []
    shared_strings = {d.name for d in proto.string_domain}
    ragged = _ragged_features(proto, origin, problems)
    for feat in proto.feature:
        if feat.name in ragged.values():
            continue  # the row lengths of a ragged feature: part of it
        if feat.type == schema_pb2.INT:
            dtype = DType.BOOL if feat.HasField("bool_domain") else DType.INT64
        elif feat.type == schema_pb2.FLOAT:
            dtype = DType.FLOAT32
        elif feat.type == schema_pb2.BYTES:
            utf8 = (
                feat.HasField("string_domain")
                or (feat.HasField("domain") and feat.domain in shared_strings)
                or "utf8" in feat.annotation.tag
            )
            dtype = DType.STRING if utf8 else DType.BYTES
        else:
            problems.append(f"{origin}: feature {feat.name!r} has no usable type")
            continue
        shape: tuple[int, ...]
        if feat.name in ragged:
            shape = RAGGED
        elif feat.HasField("shape"):
            shape = tuple(d.size for d in feat.shape.dim)
        elif feat.HasField("value_count") and feat.value_count.min == feat.value_count.max == 1:
            shape = ()
        elif feat.HasField("value_count") and feat.value_count.min == feat.value_count.max > 1:
            shape = (feat.value_count.max,)
        else:
            shape = (VARIABLE,)
        required = feat.presence.min_fraction >= 1.0 and shape != (VARIABLE,)
        try:
            features.append(
                Feature(
                    name=feat.name,
                    dtype=dtype,
                    shape=shape,
                    nulls=NullPolicy.REQUIRED if required else NullPolicy.ABSENT,
                )
            )
        except ValueError as exn:
            problems.append(f"{origin}: {exn}")
    if problems:
        raise SchemaError("invalid schema:\n  " + "\n  ".join(problems))
    return Schema(tuple(features), origin=origin)


def _ragged_features(proto: schema_pb2.Schema, origin: str, problems: list[str]) -> dict[str, str]:
    """{ragged feature: its row lengths feature} from the schema's tensor representations."""
    out = {}
    for group in proto.tensor_representation_group.values():
        for name, rep in group.tensor_representation.items():
            if not rep.HasField("ragged_tensor"):
                continue
            steps = list(rep.ragged_tensor.feature_path.step)
            lengths = [p.row_length for p in rep.ragged_tensor.partition]
            if len(steps) != 1 or len(lengths) != 1 or not lengths[0]:
                problems.append(
                    f"{origin}: ragged tensor {name!r}: only one feature partitioned once by row "
                    "lengths is supported"
                )
            elif lengths[0] != f"{steps[0]}.row_lengths":
                problems.append(
                    f"{origin}: ragged tensor {name!r}: its row lengths must be feature "
                    f"{steps[0] + '.row_lengths'!r}, not {lengths[0]!r}"
                )
            else:
                out[steps[0]] = lengths[0]
    return out
