"""A run's destination: the version it writes, what it keeps of a killed run, a sink per split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recordforge.files import layout
from recordforge.output.pieces import Reuse
from recordforge.output.placed_pieces import PlacedKeep
from recordforge.output.publishing import Publication, Target
from recordforge.records.shard_spec import ShardSpec
from recordforge.records.tfrecord import BatchKey

__all__ = ["Destination", "Kept", "Sink"]


@dataclass(frozen=True)
class Kept:
    """What one writer keeps of a killed run, as one value: a rolling writer's finished `parts`
    (less the `held` records of batches converted again), a placed writer's finished shards
    (`placed`), or the shards a writer had already `published` at their final names."""

    parts: tuple[dict[str, Any], ...] = ()
    held: dict[BatchKey, tuple[tuple[int, int], ...]] | None = None
    placed: PlacedKeep | None = None
    published: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Sink:
    """Where one writer writes (`folder`), how (`spec`), where it records its pieces for a rerun
    (`pieces`, None: it does not), and what it keeps (`kept`)."""

    folder: str
    spec: ShardSpec
    pieces: str | None = None
    kept: Kept = field(default_factory=Kept)


@dataclass(frozen=True)
class Destination:
    """Everything about the output a run writes, built once when it is resolved: the target and
    the version folder, each split's shard spec, whether its steps record pieces for a rerun, what
    it keeps of the killed run it continues (`reuse`), and the publication that commits it. The
    steps ask it (`sink`, `finished`, `temp_dirs`) rather than each reading the resume plan."""

    target: Target
    version: str
    shards: dict[str, ShardSpec]  # by writer: a split's name, or "data" without splits
    records: bool = False  # the steps record their pieces (pieces.py) for a rerun
    reuse: Reuse | None = None
    journal: dict[str, Any] | None = None  # the run's journal entry's `resume`, for a rerun to find it

    @property
    def output(self) -> str:
        return self.target.output.rstrip("/")

    @property
    def root(self) -> str:
        """The version folder: everything the run writes is below it (layout.py)."""
        return layout.version_root(self.output, self.version)

    @property
    def pieces(self) -> str | None:
        """Where the steps record their finished pieces (None: they do not)."""
        return layout.pieces_dir(self.root) if self.records else None

    @property
    def finished(self) -> frozenset[tuple[str, int]]:
        """The source batches a killed run finished: not read or converted again."""
        return self.reuse.batches if self.reuse is not None else frozenset()

    @property
    def finished_rows(self) -> dict[tuple[str, int], int] | None:
        """Those batches with their rows (a reader skips them without decoding them)."""
        return self.reuse.batch_rows if self.reuse is not None else None

    def sink(self, name: str, *, split_folder: bool) -> Sink:
        """Writer `name`'s sink: `{version}/{name}/` for a split, the version folder without."""
        folder = layout.join(self.root, name) if split_folder else self.root
        reuse = self.reuse
        if reuse is None:
            return Sink(folder, self.shards[name], self.pieces)
        kept = Kept(
            parts=reuse.parts.get(name, ()),
            held=reuse.held.get(name),
            placed=reuse.placed.get(name),
            published=reuse.published.get(name, ()),
        )
        return Sink(folder, self.shards[name], self.pieces, kept)

    def temp_dirs(self) -> list[str]:
        """What the commit deletes of this run's working folders: the record of pieces, and the
        killed run's part folders whose kept files the writers have joined."""
        dirs = [layout.pieces_dir(self.root)] if self.records else []
        if self.reuse is not None:
            dirs.extend(sorted(self.reuse.temp_dirs))
        return dirs

    @property
    def resumed(self) -> dict[str, Any] | None:
        """metadata.json's `resumed`."""
        return self.reuse.describe() if self.reuse is not None else None

    def publication(self, *, published_is_success: bool = False) -> Publication:
        """The lock, journal entry and cleanup held around the run (publishing.py)."""
        return Publication(
            self.target,
            self.version,
            published_is_success=published_is_success,
            resume=self.journal,
            # A version the killed run finished is committed whole: nothing of it is adopted.
            kept=self.reuse.files if self.reuse is not None and self.reuse.finished is None else None,
        )

    @property
    def finished_manifest(self) -> dict[str, Any] | None:
        """The killed run's own manifest, where it had finished its version: committed as it is,
        its shards checked, without running the pipeline (finished.py)."""
        return self.reuse.finished if self.reuse is not None else None
