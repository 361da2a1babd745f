"""ReadImageFolder: every image under a root folder, labelled by its parent folder's name."""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import os
import zlib
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.errors import SourceError
from recordforge.files.storage import is_local, match
from recordforge.images.files import IMAGE_EXTENSIONS, read_local_files
from recordforge.runners.traits import RunnerTraits
from recordforge.schemas.kinds import DType, NullPolicy
from recordforge.schemas.model import Feature, Schema
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.sharing import Claims, SharedItemsFn, known_items
from recordforge.transforms.source_types import UNREADABLE, SourceBatch

__all__ = [
    "chunk_at",
    "chunk_entries",
    "chunk_ranges",
    "folder_schema",
    "ImageFolder",
    "list_image_folder",
    "ReadImageFolder",
    "split_by_bytes",
    "SPLIT_FOLDERS",
]

SPLIT_FOLDERS = ("train", "eval", "validation", "test")


class ImageFolder:
    """The listing of a folder of images: (path, label, split) in listing order, and the labels.

    Held as groups, one per folder: (folder, its image names in order, label, split). Label and
    split are a folder's, and a path is its folder and a name, so nothing is kept per image but
    its name; per-image rows are made a chunk at a time, with Arrow kernels (`chunk_at`).
    A Python tuple per image would cost the driver time per image, and the cyclic garbage
    collector more as they piled up.

    Names only: a local folder's files are sized as the workers read them (a `stat` is ~2 us a
    file, the larger part of listing a local folder).
    `sizes` are kept where the listing gives them for free (object stores). `digest` stands for
    the names, `modified` is the latest change of a folder (a file added, removed or renamed).
    """

    def __init__(
        self,
        root: str,
        groups: list[tuple[str, list[str], str, str]],
        labels: list[str],
        splits: list[str],
        sizes: list[int] | None,
        modified: float,
    ) -> None:
        self.root = root
        self.groups = groups
        self.count = sum(len(names) for _, names, _, _ in groups)
        self.labels = labels
        self.splits = splits
        self.sizes = sizes
        self.modified = modified
        self._label_ids: dict[tuple[str, ...], np.ndarray] = {}

    def __getstate__(self) -> dict[str, object]:
        # Pickled with a reading DoFn: the listing itself, not what is derived from it (the names
        # again as Arrow arrays, which a worker makes when it first needs them). The names go as
        # one compressed string: Beam's pickler walks a list of strings an object at a time and
        # then compresses the result at its slowest setting, which costs the driver more than
        # the whole listing took to make.
        kept = ("root", "count", "labels", "splits", "sizes", "modified")
        names = "\0".join(itertools.chain.from_iterable(g[1] for g in self.groups)).encode()
        groups = [(folder, len(names_), label, split) for folder, names_, label, split in self.groups]
        return {**{k: self.__dict__[k] for k in kept}, "groups": groups, "names": zlib.compress(names, 1)}

    def __setstate__(self, state: dict[str, object]) -> None:
        groups = state.pop("groups")
        names = zlib.decompress(state.pop("names")).decode().split("\0")  # type: ignore[arg-type]
        self.__dict__.update(state)
        starts = itertools.accumulate((n for _, n, _, _ in groups), initial=0)  # type: ignore[attr-defined]
        self.groups = [
            (folder, names[start : start + n], label, split)
            for (folder, n, label, split), start in zip(groups, starts, strict=False)  # type: ignore[call-overload]
        ]
        self._label_ids = {}

    @property
    def entries(self) -> list[tuple[str, str, str]]:
        """(path, label, split) per image, made on each call: for inspection and tests."""
        return [
            (f"{folder}/{name}", label, split)
            for folder, names, label, split in self.groups
            for name in names
        ]

    def part(self, start: int, rows: int) -> tuple[list[tuple[str, list[str], str, str]], list[int] | None]:
        """Rows [start, start + rows) of the listing in its own compact form: the groups they fall
        in, each with its slice of names, and their sizes (None for a local folder). What a chunk
        carries to a worker that does not hold the listing."""
        end = start + rows
        ends = self._group_ends
        groups = []
        for i in range(bisect.bisect_right(ends, start), len(ends)):
            folder, names, label, split = self.groups[i]
            first = ends[i] - len(names)
            groups.append((folder, names[max(start - first, 0) : end - first], label, split))
            if ends[i] >= end:
                break
        sizes = self.sizes[start:end] if self.sizes is not None else None
        return groups, sizes

    @functools.cached_property
    def _group_ends(self) -> list[int]:
        """Per group, the listing row after its last image."""
        return list(itertools.accumulate(len(names) for _, names, _, _ in self.groups))

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the paths in listing order, NUL-separated: one join per folder."""
        joined = "\0".join(
            f"{folder}/" + f"\0{folder}/".join(names) for folder, names, _, _ in self.groups if names
        )
        return hashlib.sha256(joined.encode()).hexdigest()

    def group_label_ids(self, labels: list[str]) -> np.ndarray:
        """Per group, the index of its label in `labels` (the label list the pipeline was built
        with): made once per list, not once per chunk."""
        key = tuple(labels)
        if key not in self._label_ids:
            ids = {label: i for i, label in enumerate(labels)}
            self._label_ids[key] = np.array([ids[g[2]] for g in self.groups], np.int64)
        return self._label_ids[key]

    @functools.cached_property
    def _columns(self) -> tuple[pa.Array, np.ndarray, pa.Array, pa.Array, pa.Array]:
        """Every name as one Arrow array, the group of each, and per group: prefix, label, split."""
        names = pa.array(list(itertools.chain.from_iterable(g[1] for g in self.groups)), pa.string())
        group_of = np.repeat(np.arange(len(self.groups), dtype=np.int32), [len(g[1]) for g in self.groups])
        prefixes = pa.array([f"{g[0]}/" for g in self.groups], pa.string())
        labels = pa.array([g[2] for g in self.groups], pa.string())
        splits = pa.array([g[3] for g in self.groups], pa.string())
        return names, group_of, prefixes, labels, splits


def list_image_folder(root: str) -> ImageFolder:
    """Lists names only, never contents; no image found is an error. Called at construction (for
    the labels, and to fail early); `ReadImageFolder` hands the listing to the workers. Entries
    are in folder order, then name order."""
    root = root.rstrip("/")
    sizes: list[int] | None = None
    modified = 0.0
    by_folder: dict[str, list[str]] = {}  # folder -> names, in order
    size_of: dict[str, int] | None = None
    if not is_local(root):
        size_of = {m.path: m.size for m in match(f"{root}/**") if m.path.lower().endswith(IMAGE_EXTENSIONS)}
        for path in size_of:
            folder, _, name = path.rpartition("/")
            by_folder.setdefault(folder, []).append(name)
    else:
        root = os.path.abspath(root)  # listed paths are then absolute, never re-resolved
        by_folder, modified = _walk_local(root)
    groups: list[tuple[str, list[str], str, str]] = []
    labels, splits = set(), set()
    for folder in sorted(by_folder):
        # Label and split are the same for a folder's files: worked out once, not per file.
        parts = folder[len(root) + 1 :].split("/") if folder != root else []
        split = parts[0] if len(parts) >= 2 and parts[0] in SPLIT_FOLDERS else ""
        label = parts[-1] if parts and not (len(parts) == 1 and split) else ""
        labels.add(label)
        if split:
            splits.add(split)
        groups.append((folder, sorted(by_folder[folder]), label, split))
    if size_of is not None:  # in the order of the entries (grouped by folder)
        sizes = [size_of[f"{folder}/{name}"] for folder, names, _, _ in groups for name in names]
    if not groups:
        raise SourceError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root}")
    return ImageFolder(root, groups, sorted(labels), sorted(splits), sizes, modified)


def _walk_local(root: str) -> tuple[dict[str, list[str]], float]:
    """Names of the image files under `root` by folder, as Beam's local `**` match lists them
    (links to files are listed, links to folders are not followed), at a fraction of its cost:
    one scandir per folder, no call per file (Beam's match spends ~20 us a file). Also the
    latest modification time of the folders."""
    found: dict[str, list[str]] = {}
    modified = 0.0
    folders = [root]
    while folders:
        folder = folders.pop()
        names: list[str] = []
        try:
            modified = max(modified, os.stat(folder).st_mtime)
            with os.scandir(folder) as it:
                for entry in it:
                    # An image's name decides first: one more call for it (is_file), one for
                    # anything else (a folder named x.png is a folder). A dangling link named like
                    # an image is listed: reading it fails, so its row is rejected naming it
                    # (rule `image`), as any image that cannot be read, instead of vanishing.
                    if entry.name.lower().endswith(IMAGE_EXTENSIONS) and (
                        entry.is_file() or (entry.is_symlink() and not entry.is_dir())
                    ):
                        names.append(entry.name)
                    elif entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
        except FileNotFoundError:
            continue
        except OSError as exn:  # Beam's listing skips an unreadable folder; its images would vanish
            raise SourceError(f"{folder}: cannot list this folder: {exn}") from exn
        if names:
            found[folder] = names
    return found, modified


def chunk_entries(
    folder: ImageFolder, batch_size: int, labels: list[str]
) -> Iterator[tuple[int, pa.RecordBatch, list[int] | None]]:
    """(first row, batch of (path, label, label_id, split), the files' sizes if listed): at most
    `batch_size` images each. Arrow batches, so that moving them between stages is a copy of a
    few buffers rather than a pickle of every path (~2 us an image)."""
    for start, rows in chunk_ranges(folder.count, batch_size):
        sizes = folder.sizes[start : start + rows] if folder.sizes is not None else None
        yield start, chunk_at(folder, start, rows, labels), sizes


def chunk_ranges(count: int, batch_size: int) -> Iterator[tuple[int, int]]:
    """(first row, rows) of each chunk of a listing of `count` images."""
    for start in range(0, count, batch_size):
        yield start, min(batch_size, count - start)


def chunk_at(folder: ImageFolder, start: int, rows: int, labels: list[str]) -> pa.RecordBatch:
    """Rows [start, start + rows) of the listing as a batch of (path, label, label_id, split),
    made with Arrow kernels from the groups (label ids index `labels`)."""
    names, group_of, prefixes, group_labels, group_splits = folder._columns
    group_ids = folder.group_label_ids(labels)
    group = group_of[start : start + rows]
    at = pa.array(group)
    return pa.RecordBatch.from_pydict(
        {
            "path": pc.binary_join_element_wise(prefixes.take(at), names.slice(start, rows), ""),
            "label": group_labels.take(at),
            "label_id": pa.array(group_ids[group], pa.int64()),
            "split": group_splits.take(at),
        }
    )


def split_by_bytes(sizes: list[int], batch_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) ranges of about `batch_bytes` of files each (at least one file)."""
    start, size = 0, 0
    for i, file_size in enumerate(sizes):
        if i > start and size + file_size > batch_bytes:
            yield start, i
            start, size = i, 0
        size += file_size
    yield start, len(sizes)


def folder_schema(folder: ImageFolder) -> Schema:
    features = [
        Feature("image", DType.IMAGE, column="path", nulls=NullPolicy.REQUIRED),
        Feature("label", DType.STRING, nulls=NullPolicy.REQUIRED),
        Feature(
            "label_id",
            DType.INT64,
            nulls=NullPolicy.REQUIRED,
            description="index of label in the sorted label vocabulary (metadata: labels)",
        ),
    ]
    if folder.splits:
        features.append(Feature("split", DType.STRING, nulls=NullPolicy.REQUIRED))
    return Schema(
        tuple(features),
        origin="image folder",
        notes=(f"labels from parent folder names: {len(folder.labels)} labels",),
    )


def _read_local_chunk(
    root: str, first: int, batch: pa.RecordBatch, batch_bytes: int
) -> Iterator[SourceBatch]:
    """A local folder's chunk, its images read here into each batch's `read`: bounded in file
    bytes too, the batch cut as the files are read (a stat per file first would cost ~1.5 us of
    the ~5 us an image takes)."""
    for start, data in read_local_files(batch.column("path").to_pylist(), batch_bytes):
        part = batch.slice(start, len(data))
        yield SourceBatch(root, first + start, part, read={"path": data})


def _cut_by_bytes(
    root: str, first: int, batch: pa.RecordBatch, sizes: list[int], batch_bytes: int
) -> Iterator[SourceBatch]:
    """An object store's chunk, cut by the listed sizes: the images of a batch are in memory
    together (read by ToExamples, on threads)."""
    for start, end in split_by_bytes(sizes, batch_bytes):
        yield SourceBatch(root, first + start, batch.slice(start, end - start))


class _LocalChunkFn(SharedItemsFn):
    """Reads the images of a chunk of a folder's listing. A chunk is (first row, rows): the paths
    are made here from the listing the pipeline was built on, which this DoFn holds (pickled with
    it, for local workers: `held`). Sending the paths instead (a listing stage, then every path
    through the runner) would delay the first image by a stage and by copying every path. For
    workers that may run anywhere, a chunk carries its part of the listing, (first row, rows,
    groups, sizes) as `ImageFolder.part` makes it, so that none lists the folder again (an object
    store's listing can take minutes, and is made at construction) and the job holds no copy of
    the whole listing.

    A local folder's images are read here, into each batch's `read`; an object store's chunk is
    cut by the listed sizes, and its images are read downstream in the same fused stage, by the
    worker that claimed the chunk."""

    def __init__(
        self, folder: ImageFolder, batch_bytes: int, *, held: bool = True, claims: str | None = None
    ) -> None:
        super().__init__(claims)
        self._root = folder.root
        self._folder = folder if held else None
        self._labels = folder.labels  # as the pipeline was built with them (ids in metadata.json)
        self._batch_bytes = batch_bytes

    def name(self, chunk: tuple) -> str:
        return str(chunk[0])  # its first row: unique in the listing

    def read(self, chunk: tuple, claims: Claims | None) -> Iterator[SourceBatch]:
        first, rows, *carried = chunk
        sizes: list[int] | None
        if carried:
            groups, sizes = carried
            part = ImageFolder(self._root, groups, self._labels, [], sizes, 0.0)
            batch = chunk_at(part, 0, part.count, self._labels)
        else:
            folder = self._folder
            if folder is None:
                raise ValueError(f"{self._root}: chunk {first} carries no listing, and none is held")
            batch = chunk_at(folder, first, rows, self._labels)
            sizes = folder.sizes[first : first + rows] if folder.sizes is not None else None
        if sizes is None:
            yield from _read_local_chunk(self._root, first, batch, self._batch_bytes)
        else:
            yield from _cut_by_bytes(self._root, first, batch, sizes, self._batch_bytes)


class ReadImageFolder(beam.PTransform):
    """Images under a folder as record batches of (path, label, label_id, split).

    In: a PBegin. Out: {"batches": `SourceBatch`es of images' paths and labels (bounded in count
    and in file bytes), "unreadable": empty}. Labels are parent folder names, ids index the
    sorted label list; a top-level train/eval/validation/test folder gives the split. The image
    bytes are read on the workers: a local folder's here, into each batch's `read` (a file that
    cannot be read is left null there, and ToExamples rejects its row with the reason); an object
    store's by ToExamples, on threads, through Beam's filesystems. The work items are chunks of
    `batch_size` names of the listing made at construction (sharing.py): local workers (`traits`)
    hold the whole listing, others get each chunk's part of it.
    """

    def __init__(
        self,
        folder: ImageFolder,
        *,
        batch_size: int = 4096,
        batch_bytes: int = 64 << 20,
        traits: RunnerTraits,
    ) -> None:
        super().__init__()
        self._folder = folder
        self._traits = traits
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        folder, traits = self._folder, self._traits
        read_fn = _LocalChunkFn(folder, self._batch_bytes, held=traits.local, claims=traits.claims)
        ranges = list(chunk_ranges(folder.count, self._batch_size))
        chunks, extra = known_items(
            pbegin, read_fn, ranges, traits, label="Chunks", carry=functools.partial(_carried, folder)
        )
        # (first row, rows[, groups, sizes])
        # No file is unreadable here (an unreadable image is a rejected row): an empty output of
        # the reading stage itself, where a Create([]) would be a stage of its own.
        read = chunks | "Read" >> beam.ParDo(read_fn, *extra).with_outputs(UNREADABLE, main="batches")
        batches = declare_element_type(read.batches, SourceBatch)
        return {"batches": batches, UNREADABLE: read[UNREADABLE]}


def _carried(folder: ImageFolder, chunk: tuple[int, int]) -> tuple:
    """A chunk with its part of the listing, for a worker that does not hold it."""
    return (*chunk, *folder.part(*chunk))
