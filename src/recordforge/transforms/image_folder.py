"""ReadImageFolder: every image under a root folder, labelled by its parent folder's name."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa

from recordforge.errors import SourceError
from recordforge.images import IMAGE_EXTENSIONS
from recordforge.schemas.model import DType, Feature, NullPolicy, Schema
from recordforge.transforms.sources import UNREADABLE, SourceBatch

__all__ = ["ImageFolder", "ReadImageFolder", "SPLIT_FOLDERS", "folder_schema", "list_image_folder"]

SPLIT_FOLDERS = ("train", "eval", "validation", "test")


class ImageFolder:
    """The listing of a folder of images: (path, label, split) sorted by path, and the labels."""

    def __init__(self, root: str, entries: list[tuple[str, str, str]], sizes: list[int]) -> None:
        self.root = root
        self.entries = entries
        self.sizes = sizes
        self.labels = sorted({label for _, label, _ in entries})
        self.splits = sorted({split for _, _, split in entries if split})
        # Names this listing for workers that share the driver's memory (see _ListFolderFn).
        self.listing_id = uuid.uuid4().hex


# Listings made in this process, by listing_id: a worker running in the driver's process, or
# forked from it (pipelines/workers.py), takes the listing the pipeline was built on instead of
# listing the folder again (0.3 s per 60k files). The last few are kept, for retried bundles.
_LISTINGS: dict[str, ImageFolder] = {}
_KEEP_LISTINGS = 4


def _remember(folder: ImageFolder) -> None:
    _LISTINGS[folder.listing_id] = folder
    while len(_LISTINGS) > _KEEP_LISTINGS:
        del _LISTINGS[next(iter(_LISTINGS))]


def list_image_folder(root: str) -> ImageFolder:
    """Lists names only, never contents; no image found is an error. Called at construction (for
    the labels and to fail early) and again on a worker, so the listing is not in the job graph."""
    root = root.rstrip("/")
    if "://" in root:
        from apache_beam.io.filesystems import FileSystems

        matches = FileSystems.match([f"{root}/**"])[0].metadata_list
        listed = [(m.path, m.size_in_bytes) for m in matches]
    else:
        root = os.path.abspath(root)  # listed paths are then absolute, never re-resolved
        listed = _walk_local(root)
    found = sorted((path, size) for path, size in listed if path.lower().endswith(IMAGE_EXTENSIONS))
    if not found:
        raise SourceError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root}")
    entries = []
    for path, _ in found:
        parts = path[len(root) + 1 :].split("/")
        split = parts[0] if len(parts) > 2 and parts[0] in SPLIT_FOLDERS else ""
        label = parts[-2] if len(parts) >= 2 and not (len(parts) == 2 and split) else ""
        entries.append((path, label, split))
    return ImageFolder(root, entries, [size for _, size in found])


def _walk_local(root: str) -> list[tuple[str, int]]:
    """(path, size) of every file under `root`, as Beam's local `**` match lists them (links to
    files are listed, links to folders are not followed), at a fraction of its cost: one
    scandir per folder and one stat per file (Beam's match spends ~20 us a file: 60k files took
    over a second, twice per run)."""
    found: list[tuple[str, int]] = []
    folders = [root]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except FileNotFoundError:
            continue
        except OSError as exn:  # Beam's listing skips an unreadable folder; its images would vanish
            raise SourceError(f"{folder}: cannot list this folder: {exn}") from exn
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.path)
            elif entry.is_file():
                try:
                    found.append((entry.path, entry.stat().st_size))
                except OSError:  # gone since the folder was read, or a dangling link
                    pass
    return found


def chunk_entries(
    folder: ImageFolder, batch_size: int, batch_bytes: int
) -> Iterator[tuple[int, list[tuple[str, str, str]]]]:
    """(first row, entries): at most `batch_size` images and about `batch_bytes` of files each."""
    start, size = 0, 0
    for i, file_size in enumerate(folder.sizes):
        if i > start and (i - start >= batch_size or size + file_size > batch_bytes):
            yield start, folder.entries[start:i]
            start, size = i, 0
        size += file_size
    yield start, folder.entries[start:]


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


class _ListFolderFn(beam.DoFn):
    def __init__(self, expected: int, listing_id: str, batch_size: int, batch_bytes: int) -> None:
        self._expected = expected
        self._listing_id = listing_id
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes

    def process(self, root: str) -> Iterator[tuple[int, list[tuple[str, str, str]]]]:
        folder = _LISTINGS.get(self._listing_id) or list_image_folder(root)
        if len(folder.entries) != self._expected:
            # Rows would be numbered against a different listing than the one checked at launch.
            raise SourceError(
                f"{root}: {len(folder.entries)} images now, {self._expected} when "
                "the pipeline was built; the folder changed during the run"
            )
        yield from chunk_entries(folder, self._batch_size, self._batch_bytes)


class _FolderBatchFn(beam.DoFn):
    def __init__(self, root: str, labels: list[str]) -> None:
        self._root = root
        self._labels = labels

    def setup(self) -> None:
        self._ids = {label: i for i, label in enumerate(self._labels)}

    def process(self, chunk: tuple[int, list[tuple[str, str, str]]]) -> Iterator[SourceBatch]:
        first, entries = chunk
        batch = pa.RecordBatch.from_pydict(
            {
                "path": pa.array([e[0] for e in entries], pa.string()),
                "label": pa.array([e[1] for e in entries], pa.string()),
                "label_id": pa.array([self._ids[e[1]] for e in entries], pa.int64()),
                "split": pa.array([e[2] for e in entries], pa.string()),
            }
        )
        yield SourceBatch(self._root, first, batch)


class ReadImageFolder(beam.PTransform):
    """Images under a folder as record batches of (path, label, label_id, split).

    In: a PBegin. Out: {"batches": `SourceBatch`es of images' paths and labels (bounded in count
    and in file bytes),
    "unreadable": empty}. Labels are parent folder names, ids index the sorted label list; a
    top-level train/eval/validation/test folder gives the split. The image bytes are read by
    ToExamples, on the workers, through Beam's filesystems.
    """

    def __init__(self, folder: ImageFolder, *, batch_size: int = 4096, batch_bytes: int = 64 << 20) -> None:
        super().__init__()
        self._folder = folder
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        _remember(self._folder)
        batches = (
            pbegin
            | "Root" >> beam.Create([self._folder.root])
            | "List"
            >> beam.ParDo(
                _ListFolderFn(
                    len(self._folder.entries), self._folder.listing_id, self._batch_size, self._batch_bytes
                )
            )
            # (first row, [(path, label, split)]): file names only
            | "Spread" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(_FolderBatchFn(self._folder.root, self._folder.labels))
        )
        unreadable = pbegin | "NoUnreadable" >> beam.Create([], reshuffle=False)
        return {"batches": batches, UNREADABLE: unreadable}
