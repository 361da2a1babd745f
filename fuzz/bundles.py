"""Small bundles the tools harness mutates, and the seed inputs of every harness; all made by code."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from recordforge.records import array_records, webdataset
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.example_pb import Example
from recordforge.schemas import compile_schema, schema_from_dict

__all__ = ["FILES", "JSON_FILES", "JSON_MODES", "KINDS", "build_bundles", "example", "frame", "seeds"]

# The bundles (one shard each) and the files of a bundle an input may replace: the records and
# their index (metadata.json and feature_spec.json: fuzz/bundle_json.py).
KINDS = ("none", "gzip", "array_record", "webdataset")
FILES = ("shard", "index")
# fuzz/bundle_json.py: the files it damages, and how (the new content, or edits of the parsed JSON).
JSON_FILES = ("metadata.json", "feature_spec.json")
JSON_MODES = ("bytes", "structured")
SPEC = {
    "id": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []},
    "score": {"kind": "FixedLenFeature", "dtype": "float32", "shape": [2]},
    "name": {"kind": "VarLenFeature", "dtype": "string"},
    "tags": {
        "kind": "RaggedFeature",
        "dtype": "int64",
        "value_key": "tags",
        "partitions": [{"row_lengths": "tags.row_lengths"}],
    },
}
_SIGNALLING_NAN = (
    "GgAKGAoFCgF6EgAKDwoDa8OpEggSBgoE9/+/fwIACgAEAAoCCgAaAAoYCgUKAXoSAAoPCgNrw6kSCBIGCgQAAAAAwH8CAAoABAAKAg=="
)


def example(**features: tuple[str, list[Any]]) -> bytes:
    """A serialized Example: name=(kind, values), kind "int64", "float", "bytes" or "none"."""
    ex = Example()
    for name, (kind, values) in features.items():
        feature = ex.features.feature[name]
        if kind == "none":
            feature.SetInParent()
        else:
            listed = getattr(feature, f"{kind}_list")
            listed.SetInParent()
            listed.value.extend(values)
    return ex.SerializeToString()


def frame(data: bytes) -> bytes:
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))


def _records() -> list[bytes]:
    return [
        example(
            id=("int64", [i]),
            score=("float", [i / 2, -1.5]),
            name=("bytes", [b"r%d" % i, b"\xff\x00"]),
            tags=("int64", list(range(i % 3))),
            **{"tags.row_lengths": ("int64", [i % 3])},
        )
        for i in range(6)
    ]


# The WebDataset bundle's features: a member of each kind the reader maps back (.cls, .npy of a
# fixed and of a variable shape, .bin, .pyd, .json).
_WDS_FEATURES = [
    {"name": "id", "type": "int64"},
    {"name": "score", "type": "float32", "shape": [2]},
    {"name": "raw", "type": "bytes"},
    {"name": "name", "type": "bytes", "shape": [-1]},
    {"name": "words", "type": "string", "shape": [-1]},
    {"name": "tags", "type": "int64", "shape": [-1]},
]


_WDS_SPEC = {
    "id": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []},
    "score": {"kind": "FixedLenFeature", "dtype": "float32", "shape": [2]},
    "raw": {"kind": "FixedLenFeature", "dtype": "string", "shape": []},
    "name": {"kind": "VarLenFeature", "dtype": "string"},
    "words": {"kind": "VarLenFeature", "dtype": "string"},
    "tags": {"kind": "VarLenFeature", "dtype": "int64"},
}


def _wds_records() -> list[bytes]:
    return [
        example(
            id=("int64", [i]),
            score=("float", [i / 2, -1.5]),
            raw=("bytes", [b"\x00\xff" * i]),
            name=("bytes", [b"r%d" % i, b"\xff\x00"]),
            words=("bytes", [b"a", "\u00e9".encode()][: i % 3]),
            tags=("int64", list(range(i % 3))),
        )
        for i in range(6)
    ]


def build_bundles(root: Path) -> dict[str, Path]:
    """One bundle per kind under `root`, each passing `verify`."""
    records = _records()
    out: dict[str, Path] = {}
    for kind in KINDS:
        folder = root / kind
        folder.mkdir(parents=True)
        shard: dict[str, Any] = {"records": len(records)}
        extra: dict[str, Any] = {"compression": kind, "tf_compression_type": ""}
        if kind == "webdataset":
            name = "data-00000-of-00001.tar"
            codec = webdataset.SampleCodec.of(
                compile_schema(schema_from_dict({"features": _WDS_FEATURES})).features
            )
            samples = [
                codec.encode(webdataset.sample_key("a.parquet", i), r) for i, r in enumerate(_wds_records())
            ]
            (folder / name).write_bytes(b"".join(samples) + webdataset.END_OF_ARCHIVE)
            extra = {
                "format": webdataset.WEBDATASET,
                "compression": "none",
                "webdataset": webdataset.webdataset_facts(),
            }
        elif kind == "array_record":
            name = "data-00000-of-00001.array_record"
            writer = array_records.open_writer(str(folder / name), array_records.writer_options("none"))
            for r in records:
                writer.write(r)
            writer.close()
            extra = {"compression": "none", "format": "array_record"}
        else:
            framed = [frame(r) for r in records]
            name = "data-00000-of-00001.tfrecord" + (".gz" if kind == "gzip" else "")
            plain = b"".join(framed)
            (folder / name).write_bytes(gzip.compress(plain, mtime=0) if kind == "gzip" else plain)
            if kind == "none":
                at, lines = 0, []
                for f in framed:
                    lines.append(f"{at} {len(f)}\n")
                    at += len(f)
                (folder / f"{name}.tfindex").write_text("".join(lines))
                shard["index"] = f"{name}.tfindex"
            else:
                extra["tf_compression_type"] = "GZIP"
        data = (folder / name).read_bytes()
        shard.update(file=name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        meta = {
            "shards": [shard],
            "num_records": len(records),
            "rows_read": len(records),
            "rows_written": len(records),
            "rows_rejected": 0,
            "schema_origin": "declared",
            "schema_fingerprint": "0" * 64,
            **extra,
        }
        (folder / "metadata.json").write_text(json.dumps(meta))
        (folder / "feature_spec.json").write_text(json.dumps(_WDS_SPEC if kind == "webdataset" else SPEC))
        (folder / "_SUCCESS").write_text("")
        out[kind] = folder
    return out


def bundle_file(folder: Path, which: str) -> Path | None:
    """The path of a bundle's `which` (one of FILES); None where the bundle has none."""
    meta = json.loads((folder / "metadata.json").read_text())
    shard = meta["shards"][0]
    if which == "shard":
        return folder / shard["file"]
    if which == "index":
        return folder / shard["index"] if "index" in shard else None
    return folder / which


def seeds(target: str, root: Path) -> list[bytes]:
    """The seed inputs of a harness (fuzz/run.py's targets)."""
    records = _records()
    framed = b"".join(frame(r) for r in records)
    if target in ("find_records", "data_crc_mismatches"):
        return [framed, framed[:-3], framed[:40] + b"\x00" * 20, b""]
    if target == "crc32c":
        return [b"", b"a", bytes(range(256)), framed]
    if target == "decode_examples":
        odd = [
            example(**{"k\xe9": ("float", [float("nan")]), "z": ("none", [])}),
            b"\x0a\x00",
            b"\x0a\x02\x0a\x00",
        ]
        inputs = [b"".join(struct.pack("<H", len(r)) + r for r in group) for group in (records, odd)]
        # Found by `make fuzz`: a signalling NaN (f7 ff bf 7f), which protobuf's Python gives back quiet.
        return [*inputs, base64.b64decode(_SIGNALLING_NAN)]
    if target == "tools":
        bundles = build_bundles(root)
        out = []
        for k, kind in enumerate(KINDS):
            for f, which in enumerate(FILES):
                path = bundle_file(bundles[kind], which)
                if path is not None:
                    out.append(bytes([k * len(FILES) + f]) + path.read_bytes())
        return out
    if target == "bundle_json":
        return _json_seeds(root)
    raise ValueError(f"no harness {target!r}")


def _json_seeds(root: Path) -> list[bytes]:
    """Each bundle's metadata.json and feature_spec.json as they are (bytes mode), and edits of
    each (structured mode, fuzz/bundle_json.py's mutated_json): none, then a few that lead where
    damage hides (a shard path or index climbing out, or absolute; a version of ".."; a
    "sequence" key; a count made an object; a shape its records do not fill; a default_value;
    JSON nested 100,000 deep)."""
    bundles = build_bundles(root)
    edits = {
        "metadata.json": ["", "000101050019", "00010105001e", "000101030019", "02001128", "02000716"]
        + ["0003002a"],
        "feature_spec.json": ["", "04030501000101", "00002e", "02030a1a2d", "0403010001"],
    }
    out = []
    for k, kind in enumerate(KINDS):
        for f, which in enumerate(JSON_FILES):
            first = k + f * len(KINDS)
            out.append(bytes([first]) + (bundles[kind] / which).read_bytes())
            structured = first + len(KINDS) * len(JSON_FILES) * JSON_MODES.index("structured")
            out += [bytes([structured]) + bytes.fromhex(ops) for ops in edits[which]]
    return out
