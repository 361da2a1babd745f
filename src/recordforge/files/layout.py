"""Where everything of a bundle lives: the one place that names the files and folders of an output.

{output}/
  metadata.json          the commit point: the published version and its shards (paths
                         relative to {output}); replaced atomically by each publish
  _SUCCESS               written after the first commit; never removed by a rebuild
  feature_spec.json ...  copies of the published version's small files, for convenience
  v-<time>-<id>/         one version: everything one run wrote, never modified once published
    data-SSSSS-of-NNNNN.tfrecord[.gz|.deflate]   (or {split}/{split}-SSSSS-of-NNNNN...)
    [data-SSSSS-of-NNNNN.tfindex]   an uncompressed shard's record index (--record_index)
    (data-SSSSS-of-NNNNN.array_record with --output_format array_record)
    _rejected/  transform_fn/  transformed_metadata/  metadata/
    schema.pbtxt  schema.yaml  feature_spec.json  [raw_feature_spec.json]  metadata.json
    croissant.json  [dataset_info.json  features.json  label_id.labels.txt]   (TFDS, Croissant)
  _recordforge/
    lock                 held by the one run writing this output
    lock.guard           local disks: flock(2)ed while a lock is removed (lease.py); stays
  (while a run converts) v-<time>-<id>/_pieces/   the run's record of finished pieces (pieces.py):
                         batches-<32 hex>.json and part-<32 hex>.json, deleted before the commit
    runs/<version>       a run's journal entry, written before its version folder: the
                         record that RecordForge made that folder, so it may delete it
"""

from __future__ import annotations

import datetime
import posixpath
import re
import uuid

__all__ = [
    "ARRAY_RECORD_SUFFIX",
    "CROISSANT",
    "FEATURE_SPEC",
    "INDEX_SUFFIX",
    "METADATA",
    "PIECES_DIR",
    "RAW_FEATURE_SPEC",
    "RAW_METADATA",
    "REJECTED_DIR",
    "REJECTED_SUFFIX",
    "SCHEMA_PBTXT",
    "SCHEMA_YAML",
    "SHARD_TEMPLATE",
    "STATE_DIR",
    "SUCCESS",
    "TEMP_DIR_PREFIX",
    "TEMP_PART",
    "TFDS_FEATURES",
    "TFDS_INFO",
    "TFDS_LABELS",
    "TOP_COPIES",
    "TOP_FILES",
    "TRANSFORM_FILES",
    "TRANSFORM_FN",
    "TRANSFORMED_METADATA",
    "TRANSFORMED_SCHEMA",
    "guard_path",
    "is_temporary",
    "is_version",
    "join",
    "journal_dir",
    "journal_entry",
    "lock_path",
    "new_version",
    "pieces_dir",
    "rejected_prefix",
    "temp_index",
    "relative",
    "shard_name",
    "shard_prefix",
    "temp_beside",
    "temp_dir",
    "temp_file",
    "top_entry",
    "version_root",
]

SUCCESS = "_SUCCESS"
METADATA = "metadata.json"
FEATURE_SPEC = "feature_spec.json"
SCHEMA_PBTXT = "schema.pbtxt"
SCHEMA_YAML = "schema.yaml"
RAW_FEATURE_SPEC = "raw_feature_spec.json"
REJECTED_DIR = "_rejected"
REJECTED_SUFFIX = ".jsonl"  # _rejected/rejected-SSSSS-of-NNNNN.jsonl: one JSON line a rejected row
TRANSFORM_FN = "transform_fn"
TRANSFORMED_METADATA = "transformed_metadata"
RAW_METADATA = "metadata"  # where tft.TFTransformOutput looks for the raw schema
TRANSFORMED_SCHEMA = f"{TRANSFORMED_METADATA}/schema.pbtxt"
# Written by tensorflow-transform's own writers when the run had transforms.
TRANSFORM_FILES = (f"{TRANSFORM_FN}/saved_model.pb", TRANSFORMED_SCHEMA, f"{RAW_METADATA}/schema.pbtxt")
STATE_DIR = "_recordforge"
# Working files of a run's writers and of tensorflow-transform, in its version folder, deleted
# before it is published: `_tmp-<hex>/` (not hidden, so a crashed run's leftovers are visible).
TEMP_DIR_PREFIX = "_tmp-"
# Working files inside a temporary folder: `<kind>-<32 hex><ext>`, this ext unless the writer
# names another (spilled batches are ".arrow").
TEMP_PART = ".part"
# How shards are numbered, in Beam's shard_name_template spelling: data-00003-of-00008.
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"
# A shard's suffix by its compression (zlib shards are `.deflate`, which Beam and TFDV detect).
SHARD_SUFFIXES = {"gzip": ".tfrecord.gz", "zlib": ".tfrecord.deflate", "none": ".tfrecord"}
# ArrayRecord shards: the suffix TFDS gives them (its file format's name), so that its
# dataset_info.json can name them.
ARRAY_RECORD_SUFFIX = ".array_record"
# A record index beside an uncompressed TFRecord shard: one `offset size` line per record, the
# format DALI's and the `tfrecord` package's readers take (their tfrecord2idx writes `.tfindex`
# beside `.tfrecord`): data-00003-of-00008.tfindex.
INDEX_SUFFIX = ".tfindex"
# A run's record of the pieces it finished, in its version folder, so that a rerun after a crash
# keeps them (pieces.py); deleted before the version is published.
PIECES_DIR = "_pieces"
SPILL_SUFFIX = ".arrow"  # batches a local writer spilled to disk while it groups (Arrow IPC)
# Catalog metadata (schemas/tfds_metadata.py, schemas/croissant.py). Their paths are relative to
# the output, so readers are handed the output folder and read the top-level copies.
CROISSANT = "croissant.json"
TFDS_INFO = "dataset_info.json"
TFDS_FEATURES = "features.json"
TFDS_LABELS = "label_id.labels.txt"  # ClassLabel names of an image folder's label_id

# Small files copied from the published version to the top of the output after each commit.
# TFDS reads dataset_info.json first: it is copied last, after the features it describes.
TOP_COPIES = (
    FEATURE_SPEC,
    SCHEMA_PBTXT,
    SCHEMA_YAML,
    RAW_FEATURE_SPEC,
    CROISSANT,
    TFDS_FEATURES,
    TFDS_LABELS,
    TFDS_INFO,
)
# Every name RecordForge writes at the top of an output folder.
TOP_FILES = frozenset({METADATA, SUCCESS, *TOP_COPIES})

_VERSION = re.compile(r"^v-\d{8}T\d{6}Z-[0-9a-f]{8}$")
# A file written in full beside its name before it is renamed over it: `{name}.tmp-{32 hex}`.
_TEMP_BESIDE = ".tmp-"
_TEMPORARY = re.compile(rf"^(?P<name>[^/]+){re.escape(_TEMP_BESIDE)}[0-9a-f]{{32}}$")


def join(*parts: str) -> str:
    """Joins path parts with '/', for local paths and object stores alike."""
    return "/".join([parts[0].rstrip("/"), *(p.strip("/") for p in parts[1:])])


def new_version() -> str:
    """A fresh version folder name: sortable by time, unique by its random part."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"v-{now}-{uuid.uuid4().hex[:8]}"


def is_version(name: str) -> bool:
    return bool(_VERSION.match(name))


def version_root(output: str, version: str) -> str:
    return join(output, version)


def pieces_dir(root: str) -> str:
    """Where the run writing the version folder `root` records its finished pieces."""
    return join(root, PIECES_DIR)


def lock_path(output: str) -> str:
    return join(output, STATE_DIR, "lock")


def guard_path(lock: str) -> str:
    """The file beside a lock that a run removing the lock flock(2)s (lease.py); it stays."""
    return f"{lock}.guard"


def journal_dir(output: str) -> str:
    return join(output, STATE_DIR, "runs")


def journal_entry(output: str, version: str) -> str:
    return join(journal_dir(output), version)


def top_entry(output: str, path: str) -> str:
    """The first component of `path` below `output` ('' when `path` is not below it)."""
    out = output.rstrip("/") + "/"
    if not path.startswith(out):
        return ""
    return path[len(out) :].split("/", 1)[0]


def relative(path: str, output: str) -> str:
    out = output.rstrip("/") + "/"
    return path[len(out) :] if path.startswith(out) else posixpath.basename(path)


def rejected_prefix(root: str) -> str:
    """The common start of the rejected-rows files of the version folder `root`."""
    return join(root, REJECTED_DIR, "rejected")


def shard_prefix(folder: str, name: str) -> str:
    """The common start of a writer's shard names: `{folder}/{name}` (name: "data", or a split)."""
    return join(folder, name)


def shard_name(prefix: str, shard: int, count: int, suffix: str) -> str:
    """`{prefix}-SSSSS-of-NNNNN{suffix}`, SHARD_TEMPLATE filled in: data-00003-of-00008.tfrecord.gz."""
    return f"{prefix}-{shard:05d}-of-{count:05d}{suffix}"


def temp_index(temp_shard: str) -> str:
    """The index written beside a temporary shard file, until both are published."""
    return f"{temp_shard}{INDEX_SUFFIX}"


def temp_dir(folder: str) -> str:
    """A fresh folder for working files in `folder` (a run's version folder, or a split's)."""
    return join(folder, f"{TEMP_DIR_PREFIX}{uuid.uuid4().hex[:12]}")


def temp_file(temp_dir: str, kind: str, ext: str = TEMP_PART) -> str:
    """A fresh name for a working file in a temporary folder: `{temp_dir}/<kind>-<32 hex><ext>`."""
    return join(temp_dir, f"{kind}-{uuid.uuid4().hex}{ext}")


def temp_beside(path: str) -> str:
    """A fresh name beside `path` to write it in full under before a rename: `{path}.tmp-<32 hex>`."""
    return f"{path}{_TEMP_BESIDE}{uuid.uuid4().hex}"


def is_temporary(name: str) -> bool:
    """True for a `temp_beside` name of one of the files at the top of an output."""
    match = _TEMPORARY.match(name)
    return match is not None and match.group("name") in TOP_FILES
