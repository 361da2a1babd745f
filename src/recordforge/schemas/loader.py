"""Loading a schema YAML file, reporting every problem at once with its line number."""

from __future__ import annotations

import difflib
from dataclasses import replace
from enum import Enum
from typing import Any

import yaml

from recordforge.errors import SchemaError
from recordforge.schemas.analyzers import Transform
from recordforge.schemas.kinds import DType, NullPolicy, Op
from recordforge.schemas.model import Feature, Schema, feature_to_dict
from recordforge.sources.probe import open_source

__all__ = ["load_schema", "schema_from_dict", "dump_schema"]

_LINE = "__line__"
_KEYS = {
    "name",
    "type",
    "shape",
    "column",
    "nulls",
    "default",
    "narrow",
    "description",
    "encode",
    "unit",
    "as",
    "scale",
    "min",
    "max",
    "allowed",
    "max_length",
    "regex",
    "ops",
    "resize",
    "method",
    "quality",
    "channels",
    "transform",
}


# Nodes a schema document may stand for once its aliases are expanded. A real schema has a few
# thousand at most; a "billion laughs" document has billions, built from a few lines.
_MAX_EXPANDED_NODES = 100_000


class _LineLoader(yaml.SafeLoader):
    """A SafeLoader that remembers the line each mapping starts on, and refuses documents whose
    aliases expand beyond _MAX_EXPANDED_NODES before anything is constructed."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node, {})
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        mapping[_LINE] = node.start_mark.line + 1
        return mapping


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Nodes under `node` with every alias expanded; a node is measured once (aliases share it)."""
    known = sizes.get(id(node))
    if known is not None:
        if known < 0:
            raise yaml.YAMLError(f"recursive alias at line {node.start_mark.line + 1}")
        return known
    sizes[id(node)] = -1  # being measured: met again below it means a cycle
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    if total > _MAX_EXPANDED_NODES:
        raise yaml.YAMLError(
            f"the document expands to more than {_MAX_EXPANDED_NODES:,} values through its "
            f"aliases (`*name`), at line {node.start_mark.line + 1}"
        )
    sizes[id(node)] = total
    return total


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_schema(path: str) -> Schema:
    """Reads a schema YAML, or a TFMD `schema.pbtxt` (as TFDV/SchemaGen write it), from any Beam
    filesystem path; raises SchemaError listing all problems."""
    try:
        with open_source(path) as f:
            text = f.read().decode("utf-8")
    except Exception as exn:
        raise SchemaError(f"cannot read schema file {path}: {exn}") from exn
    if path.endswith((".pbtxt", ".textproto")):
        from recordforge.schemas.tfmd import schema_from_tfmd_text

        return _tfmd_floats_narrow(schema_from_tfmd_text(text, origin=path))
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exn:
        raise SchemaError(f"{path}: not valid YAML: {exn}") from exn
    return schema_from_dict(data, origin=path)


def _tfmd_floats_narrow(schema: Schema) -> Schema:
    """A TFMD FLOAT feature is float32 in TensorFlow, and a pbtxt has no way to say `narrow`: its
    float64 source columns are narrowed into it, as `narrow: true` does (a value beyond float32's
    range is a bad row), so that a schema TFDV inferred from float64 data converts that data."""
    features = tuple(replace(f, narrow=True) if f.dtype is DType.FLOAT32 else f for f in schema.features)
    return replace(schema, features=features)


def schema_from_dict(data: Any, *, origin: str = "declared") -> Schema:
    """Builds a Schema from its dict form (as loaded from YAML or JSON)."""
    where = origin
    if not isinstance(data, dict) or not isinstance(data.get("features"), list):
        raise SchemaError(f"{where}: expected a mapping with a `features:` list")
    problems: list[str] = []
    features: list[Feature] = []
    for i, entry in enumerate(data["features"]):
        line = entry.get(_LINE, "?") if isinstance(entry, dict) else "?"
        prefix = f"{where}:{line}: feature #{i + 1}"
        if not isinstance(entry, dict):
            problems.append(f"{prefix}: expected a mapping, got {_short(entry)}")
            continue
        if "name" in entry:
            prefix += f" {entry['name']!r}"
        feature, errs = _feature_from_dict(entry)
        problems.extend(f"{prefix}: {e}" for e in errs)
        if feature is not None:
            features.append(feature)
    sequence = None
    if "sequence" in data:
        from recordforge.schemas.sequence_spec import sequence_from_dict

        raw = data["sequence"]
        line = raw.pop(_LINE, "?") if isinstance(raw, dict) else "?"
        sequence, errs = sequence_from_dict(raw)
        problems.extend(f"{where}:{line}: sequence: {e}" for e in errs)
    if not problems:
        try:
            return Schema(tuple(features), origin=origin, sequence=sequence)
        except ValueError as exn:
            problems.append(f"{where}: {exn}")
    raise SchemaError("invalid schema:\n  " + "\n  ".join(problems))


def _feature_from_dict(entry: dict[str, Any]) -> tuple[Feature | None, list[str]]:
    errs: list[str] = []
    for key in sorted((k for k in entry if k not in _KEYS and k != _LINE), key=_key_text):
        # `null:` loads as the key None, `yes:` as True: show them as written.
        text = _key_text(key)
        guess = difflib.get_close_matches(text, _KEYS, n=1)
        hint = f"did you mean `{guess[0]}`?" if guess else f"known: {', '.join(sorted(_KEYS))}"
        errs.append(f"unknown key `{text}` ({hint})")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        errs.append("`name` is required and must be a string")
    dtype = _enum(DType, entry.get("type"), "type", errs, required=True)
    nulls_raw = entry.get("nulls")
    if nulls_raw is None:
        nulls_raw = "default" if "default" in entry else "absent"
    nulls = _enum(NullPolicy, nulls_raw, "nulls", errs)
    shape_raw = entry.get("shape", [])
    if not isinstance(shape_raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape_raw
    ):
        errs.append(f"`shape` must be a list of integers like [], [3], [2, 2] or [-1], got {shape_raw!r}")
        shape_raw = []
    column = entry.get("column")
    if column is not None and not isinstance(column, str):
        errs.append("`column` must be a string")
    narrow = entry.get("narrow", False)
    if not isinstance(narrow, bool):
        errs.append("`narrow` must be true or false")
    ops = _ops(entry.get("ops", []), errs)
    allowed = entry.get("allowed")
    if allowed is not None and not isinstance(allowed, list):
        errs.append("`allowed` must be a list of values")
    # min, max, max_length and scale: checked by Feature, with the value.
    transform = None
    if entry.get("transform") is not None:
        transform, transform_errs = Transform.from_dict(entry["transform"])
        errs.extend(transform_errs)
    if dtype is None or nulls is None or not isinstance(name, str) or not name:
        return None, errs
    try:
        feature = Feature(
            name=name,
            dtype=dtype,
            shape=tuple(shape_raw),
            column=column,
            nulls=nulls,
            default=entry.get("default"),
            narrow=narrow,
            encode=entry.get("encode"),
            unit=entry.get("unit"),
            decimal_as=entry.get("as"),
            scale=entry.get("scale"),
            min=entry.get("min"),
            max=entry.get("max"),
            allowed=tuple(allowed) if isinstance(allowed, list) else None,
            max_length=entry.get("max_length"),
            regex=entry.get("regex"),
            ops=ops,
            resize=tuple(entry["resize"]) if isinstance(entry.get("resize"), list) else entry.get("resize"),
            method=entry.get("method"),
            quality=entry.get("quality"),
            channels=entry.get("channels"),
            transform=transform,
            description=str(entry.get("description", "")),
        )
    except ValueError as exn:
        # Feature joins all its own problems into one message.
        return None, [*errs, str(exn).split(": ", 1)[1]]
    return (None, errs) if errs else (feature, [])


def _key_text(key: Any) -> str:
    if key is None:
        return "null"
    if isinstance(key, bool):
        return str(key).lower()
    return str(key)


def _ops(raw: Any, errs: list[str]) -> tuple[tuple[Op, Any], ...]:
    """`ops: [lower, {clip: [0, 10]}, {hash_bucket: 100}]`: names, or one-key mappings."""
    if not isinstance(raw, list):
        errs.append("`ops` must be a list")
        return ()
    out = []
    for item in raw:
        if isinstance(item, dict):
            item = {k: v for k, v in item.items() if k != _LINE}
        name, arg = (
            (item, None)
            if isinstance(item, str)
            else (next(iter(item.items())) if isinstance(item, dict) and len(item) == 1 else (None, None))
        )
        try:
            out.append((Op(name), arg))
        except ValueError:
            errs.append(f"unknown op {item!r} (known: {', '.join(o.value for o in Op)})")
    return tuple(out)


def _enum(cls: type[Enum], raw: Any, key: str, errs: list[str], *, required: bool = False) -> Any:
    if raw is None:
        if required:
            errs.append(f"`{key}` is required (one of {', '.join(m.value for m in cls)})")
        return None
    try:
        return cls(raw)
    except ValueError:
        errs.append(f"`{key}: {raw}` is not one of {', '.join(m.value for m in cls)}")
        return None


def dump_schema(schema: Schema, *, header: str = "", comments: dict[str, str] | None = None) -> str:
    """The schema as an editable YAML document; `comments` are put above each named feature."""
    lines = [header.rstrip("\n")] if header else []
    lines.append("features:")
    for f in schema.features:
        if comments and f.name in comments:
            lines.extend(f"  # {c}" for c in comments[f.name].splitlines())
        body = yaml.safe_dump(
            [feature_to_dict(f)], sort_keys=False, default_flow_style=None, allow_unicode=True
        )
        lines.extend("  " + line for line in body.rstrip("\n").splitlines())
    if schema.sequence is not None:
        block = {"sequence": schema.sequence.to_dict()}
        lines.extend(
            yaml.safe_dump(block, sort_keys=False, default_flow_style=None).rstrip("\n").splitlines()
        )
    return "\n".join(lines) + "\n"
