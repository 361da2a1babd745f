"""RecordForge: schema-driven conversion of tables and images to sharded TFRecords on Apache Beam."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "read", "load_bundle"]

if TYPE_CHECKING:
    import tensorflow as tf


def read(path: str, *, batch_size: int | None = None) -> tf.data.Dataset:
    """A tf.data.Dataset of parsed feature dicts from a RecordForge output folder (imports TF)."""
    from recordforge.reader import read as _read

    return _read(path, batch_size=batch_size)


def load_bundle(path: str) -> dict[str, Any]:
    """The bundle's metadata and feature spec; no TensorFlow needed."""
    from recordforge.reader import load_bundle as _load

    return _load(path)
