"""Reading a RecordForge output folder back with tf.data, from the bundle alone."""

from __future__ import annotations

from typing import Any

from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.files.layout import FEATURE_SPEC, METADATA, SUCCESS
from recordforge.files.storage import exists
from recordforge.records.bundle_json import load_feature_spec, load_metadata
from recordforge.schemas.export import decode_images as _decode_images
from recordforge.schemas.export import decode_parsed, to_tf_feature_spec

__all__ = ["load_bundle", "read", "version_path"]


def load_bundle(path: str, *, split: str | None = None) -> dict[str, Any]:
    """{"metadata": ..., "feature_spec": ..., "files": [shard paths], "root": the version folder};
    refuses unpublished output. `split` keeps that split's shards. The manifest is read once and
    the rest from the version it names, so a rebuild publishing meanwhile cannot mix two versions."""
    out = path.rstrip("/")
    if not exists(f"{out}/{SUCCESS}"):
        raise RecordForgeError(f"{out}: no {SUCCESS} marker; the dataset is missing or incomplete")
    meta = load_metadata(f"{out}/{METADATA}")
    root = layout.version_root(out, meta["version"]) if meta.get("version") else out
    shards = meta["shards"]
    if split is not None:
        if split not in meta.get("split_counts", {}):
            raise RecordForgeError(
                f"{out}: no split {split!r} (splits: {', '.join(meta.get('split_counts', {})) or 'none'})"
            )
        shards = [s for s in shards if s.get("split") == split]
    return {
        "metadata": meta,
        "feature_spec": load_feature_spec(f"{root}/{FEATURE_SPEC}", sequence="sequence" in meta),
        "files": [f"{out}/{s['file']}" for s in shards],
        "root": root,
    }


def version_path(path: str) -> str:
    """The folder of the published version of an output: where `transform_fn/` is, for
    `tft.TFTransformOutput(recordforge.version_path(out))`, and the shards for a glob."""
    return load_bundle(path)["root"]


def read(
    path: str,
    *,
    batch_size: int | None = None,
    decode_images: bool = False,
    split: str | None = None,
) -> Any:
    """Parsed feature dicts; batched (tf.io.parse_example) when `batch_size` is given. An output
    with splits is read one split at a time: `split` names it (without it, an error lists them).
    An output of SequenceExamples (a schema with a `sequence:` block) yields (context,
    sequences) per record, or batched (context, sequences, lengths) as
    tf.io.parse_sequence_example returns them: fixed-shape step features padded with zeros to
    the longest sequence of the batch, the others ragged.
    `decode_images`: image features as uint8 [height, width, channels] tensors (per record, as
    images differ in size; so not with `batch_size`)."""
    if decode_images and batch_size:
        raise ValueError(
            "decode_images works per record: leave batch_size unset, then batch or "
            "resize the decoded images yourself"
        )
    import tensorflow as tf

    bundle = load_bundle(path, split=split)
    splits = list(bundle["metadata"].get("split_counts") or {})
    if split is None and splits:
        # Records of different splits are not meant to be mixed: a training loop reads one.
        raise RecordForgeError(
            f"{path.rstrip('/')} holds splits {', '.join(splits)}: pass split= (one of them), "
            f"e.g. recordforge.read({path!r}, split={splits[0]!r})"
        )
    if bundle["metadata"].get("format") == "array_record":
        # tf.data has no ArrayRecord reader; the data source reads them, without TensorFlow.
        raise RecordForgeError(
            f"{path.rstrip('/')} holds ArrayRecord shards, which tf.data cannot read: use "
            f"recordforge.data_source({path!r}) (Grain, tfds.data_source), or convert TFRecords"
        )
    if bundle["metadata"].get("format") == "webdataset":
        raise RecordForgeError(
            f"{path.rstrip('/')} holds WebDataset tar shards, which tf.data does not read: use "
            "webdataset.WebDataset(urls).decode() (docs/webdataset.md), or convert TFRecords"
        )
    json_spec = bundle["feature_spec"]
    compression = bundle["metadata"]["tf_compression_type"]
    files = tf.constant(bundle["files"], dtype=tf.string)
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
        cycle_length=max(1, min(len(bundle["files"]), 8)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if "sequence" in bundle["metadata"]:
        return _sequences(ds, json_spec, batch_size)
    spec = to_tf_feature_spec(json_spec)
    ds = ds.batch(batch_size or 1024).map(
        lambda x: decode_parsed(tf.io.parse_example(x, spec), json_spec),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    if batch_size:
        return ds
    ds = ds.unbatch()
    if decode_images:
        ds = ds.map(lambda r: _decode_images(r, json_spec), num_parallel_calls=tf.data.AUTOTUNE)
    return ds


def _sequences(ds: Any, json_spec: dict[str, Any], batch_size: int | None) -> Any:
    """Serialized SequenceExamples parsed with the bundle's context and sequence specs."""
    import tensorflow as tf

    from recordforge.schemas.sequence import to_tf_sequence_spec

    context, sequence = to_tf_sequence_spec(json_spec)
    if batch_size:
        return ds.batch(batch_size).map(
            lambda x: tf.io.parse_sequence_example(x, context, sequence), num_parallel_calls=tf.data.AUTOTUNE
        )
    # One record at a time: a batch would pad every sequence to the batch's longest.
    return ds.map(
        lambda x: tf.io.parse_single_sequence_example(x, context, sequence),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
