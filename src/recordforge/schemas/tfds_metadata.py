"""TensorFlow Datasets metadata for a bundle, so that `tfds.builder_from_directory(output)` reads it."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from recordforge.files import layout
from recordforge.files.layout import TFDS_FEATURES, TFDS_INFO, TFDS_LABELS
from recordforge.schemas.kinds import DType
from recordforge.schemas.model import Feature
from recordforge.schemas.plan import Plan

__all__ = ["LABEL_FEATURE", "SINGLE_SPLIT", "TFDS_VERSION", "tfds_features", "tfds_metadata"]

_LOGGER = logging.getLogger(__name__)

TFDS_VERSION = "1.0.0"  # TFDS wants MAJOR.MINOR.PATCH; RecordForge's version folder is in the template
SINGLE_SPLIT = "train"  # the one TFDS split of a bundle written without --splits
LABEL_FEATURE = "label_id"  # an image folder's label index, whose names are metadata.json's labels
_CLASSES = "tensorflow_datasets.core.features."
_TENSOR = _CLASSES + "tensor_feature.Tensor"
_TEXT = _CLASSES + "text_feature.Text"
_IMAGE = _CLASSES + "image_feature.Image"
_CLASS_LABEL = _CLASSES + "class_label_feature.ClassLabel"
_FEATURES_DICT = _CLASSES + "features_dict.FeaturesDict"
_MIN_SHARD_DIGITS = 5  # TFDS pads shard numbers to max(5, digits of the shard count)


class _Unmapped(Exception):
    """A feature TFDS cannot read back exactly; the message says why."""


def _shape(dims: Sequence[int | None]) -> dict[str, Any]:
    # Proto JSON: int64 values are strings, an unknown dimension is -1, a scalar has no dimensions.
    return {"dimensions": [str(-1 if d is None else d) for d in dims]} if dims else {}


def _tensor(dims: Sequence[int | None], dtype: str, *, encoding: str = "none") -> dict[str, Any]:
    return {
        "pythonClassName": _TENSOR,
        "tensor": {"shape": _shape(dims), "dtype": dtype, "encoding": encoding},
    }


def _labels_file_can_hold(names: Sequence[str]) -> bool:
    """TFDS reads a ClassLabel's names one per line, stripped, skipping empty lines: a name that is
    empty, padded with spaces or holds a line break would shift every index after it."""
    return bool(names) and all(n and n == n.strip() and "\n" not in n for n in names)


def _image(entry: dict[str, Any], feature: Feature | None, optional: bool) -> dict[str, Any]:
    if optional:
        raise _Unmapped("an image that may be absent (TFDS's Image cannot be missing)")
    if entry["image"]["encoding"] == "raw":
        decode = entry.get("decode")
        if decode is None:
            raise _Unmapped("raw pixels without a fixed shape (declare `resize` and `channels`)")
        return _tensor(decode["shape"], "uint8", encoding="bytes")  # tf.io.decode_raw, reshaped
    # TFDS decodes with tf.image.decode_image(channels=...): None keeps each image's own channels.
    height, width = feature.resize if feature is not None and feature.resize else (None, None)
    channels = feature.channels if feature is not None else None
    return {
        "pythonClassName": _IMAGE,
        "image": {"shape": _shape([height, width, channels]), "dtype": "uint8"},
    }


def _feature(
    name: str, entry: dict[str, Any], feature: Feature | None, labels: Sequence[str] | None
) -> dict[str, Any]:
    """The TFDS feature that parses `entry` (a feature_spec.json entry) to the values it holds."""
    kind = entry["kind"]
    if kind == "RaggedFeature":
        raise _Unmapped("a ragged list (TFDS's ragged tensors use other keys than `.row_lengths`)")
    optional = kind == "VarLenFeature"
    if "image" in entry:
        return _image(entry, feature, optional)
    if "decode" in entry:  # float64 kept bit-exact: one value of little-endian bytes per record
        if optional:
            raise _Unmapped("a byte-encoded float64 that may be absent (TFDS cannot read it missing)")
        dims = [None if d == -1 else d for d in entry["decode"]["shape"]]
        return _tensor(dims, "float64", encoding="bytes")
    dtype = entry["dtype"]
    if feature is not None and feature.dtype is DType.BOOL and dtype == "int64":
        dtype = "bool"  # TFDS parses bools from int64 lists, as they are written
    if optional:
        # Absent or variable length: a list of what the record holds (0 or 1 value for a scalar),
        # never a default standing in for a missing value. A fixed [N, M] keeps its rows.
        inner = list(feature.shape[1:]) if feature is not None and len(feature.shape) == 2 else []
        return _tensor([None, *inner], dtype)
    dims = list(entry["shape"])
    if name == LABEL_FEATURE and labels is not None and dims == [] and dtype == "int64":
        if _labels_file_can_hold(labels):
            return {"pythonClassName": _CLASS_LABEL, "classLabel": {"numClasses": str(len(labels))}}
        _LOGGER.info("TFDS: %s is a Tensor, not a ClassLabel: a label name is empty or not one line", name)
    # Text for validated UTF-8: strings, decimals as text, an image's format name (`x/format`).
    text = feature.dtype in (DType.STRING, DType.DECIMAL) if feature is not None else name.endswith("/format")
    if dtype == "string" and dims == [] and text:
        return {"pythonClassName": _TEXT, "text": {}}
    return _tensor(dims, dtype)


def tfds_features(plan: Plan, labels: Sequence[str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """features.json's FeaturesDict for `plan`'s records, and the features left out with why."""
    by_name = {f.name: f for f in plan.features}
    features: dict[str, Any] = {}
    left_out: dict[str, str] = {}
    for name, entry in sorted(plan.feature_spec.items()):
        try:
            feature = _feature(name, entry, by_name.get(name), labels)
        except _Unmapped as why:
            left_out[name] = str(why)
            continue
        description = by_name[name].description if name in by_name else ""
        if description:
            feature["description"] = description
        features[name] = feature
    return {"pythonClassName": _FEATURES_DICT, "featuresDict": {"features": features}}, left_out


def _shard_name(template: str, index: int, count: int) -> str:
    digits = max(_MIN_SHARD_DIGITS, len(str(count)))
    return template.replace("{SHARD_X_OF_Y}", f"{index:0{digits}d}-of-{count:0{digits}d}")


def _splits(meta: Mapping[str, Any], suffix: str) -> list[dict[str, Any]] | None:
    """dataset_info.json's splits, or None when a shard's name is not the one TFDS would open."""
    version = meta["version"]
    weights = meta.get("split_weights")
    names = list(weights) if weights else [SINGLE_SPLIT]
    out = []
    for split in names:
        shards = [s for s in meta["shards"] if s.get("split", SINGLE_SPLIT) == split]
        prefix = f"{version}/{split}/{split}" if weights else f"{version}/data"
        template = prefix + "-{SHARD_X_OF_Y}" + suffix
        expected = [_shard_name(template, i, len(shards)) for i in range(len(shards))]
        if [s["file"] for s in shards] != expected:
            return None
        out.append(
            {
                "name": split,
                "filepathTemplate": template,
                # Proto JSON writes int64 values as strings.
                "numBytes": str(sum(s["bytes"] for s in shards)),
                "shardLengths": [str(s["records"]) for s in shards],
            }
        )
    return out


def _dataset_name(output: str) -> str:
    """A TFDS-style name (snake_case, starting with a letter) from the output folder's name."""
    base = output.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_")
    return name if name[:1].isalpha() else f"dataset_{name}".rstrip("_")


def tfds_metadata(plan: Plan, meta: Mapping[str, Any], *, output: str) -> dict[str, bytes]:
    """The TFDS files of a bundle ({} when TFDS cannot read its shards), given metadata.json."""
    array_record = meta.get("format") == "array_record"
    if meta.get("format") == "webdataset":
        _LOGGER.info("%s: no TFDS metadata: TFDS reads no WebDataset tar shards", output)
        return {}
    if meta["compression"] != "none" and not array_record:
        _LOGGER.info(
            "%s: no TFDS metadata: TFDS reads TFRecords without a compression type, and these "
            "shards are %s (convert with --compression none to load them with tfds)",
            output,
            meta["compression"],
        )
        return {}
    splits = _splits(meta, layout.ARRAY_RECORD_SUFFIX if array_record else layout.SHARD_SUFFIXES["none"])
    if splits is None:
        _LOGGER.warning("%s: no TFDS metadata: shard names do not follow TFDS's numbering", output)
        return {}
    labels = meta.get("labels")
    features, left_out = tfds_features(plan, labels)
    for name, why in left_out.items():
        _LOGGER.info("TFDS: feature %s is left out of features.json: %s", name, why)
    mapped = features["featuresDict"]["features"]
    info: dict[str, Any] = {
        "name": _dataset_name(output),
        "description": f"RecordForge bundle {meta['version']} ({meta['num_records']} records)",
        "version": TFDS_VERSION,
        "fileFormat": "array_record" if array_record else "tfrecord",
        "splits": splits,
    }
    label = mapped.get(LABEL_FEATURE, {})
    if "image" in mapped and label.get("pythonClassName") == _CLASS_LABEL:
        # as_supervised=True then gives (image, label) pairs.
        info["supervisedKeys"] = {
            "tuple": {"items": [{"featureKey": "image"}, {"featureKey": LABEL_FEATURE}]}
        }
    files = {
        TFDS_INFO: json.dumps(info, indent=2).encode(),
        TFDS_FEATURES: json.dumps(features, indent=2).encode(),
    }
    if label.get("pythonClassName") == _CLASS_LABEL and labels is not None:
        files[TFDS_LABELS] = ("\n".join(labels) + "\n").encode()
    return files
