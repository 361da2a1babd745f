"""ReadRecords: TFRecord and ArrayRecord files of tf.train.Examples read as conformed record batches."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from recordforge.records import record_pieces
from recordforge.records.example_batches import BadRecord, ExampleDecoder
from recordforge.records.record_pieces import CorruptRecords, Piece
from recordforge.runners.traits import RunnerTraits
from recordforge.schemas.plan import Plan
from recordforge.sources.read_ahead import ReadAhead
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.sharing import Claims, SharedItemsFn, known_items
from recordforge.transforms.source_types import (
    REJECTED,
    UNREADABLE,
    FileInfo,
    SourceBatch,
    expand_patterns,
    unreadable,
)

__all__ = ["EXAMPLE", "RECORD_FORMATS", "ReadRecords"]

_LOGGER = logging.getLogger(__name__)

RECORD_FORMATS = record_pieces.FORMATS
EXAMPLE = "example"  # the rule of a record that is not an Example of the schema (never a batch)


class _Pieces:
    """A file's pieces (records/record_pieces.py), for `known_items`."""

    def __init__(self, sizes: dict[str, int | None], skip_unreadable: bool) -> None:
        self._sizes = sizes
        self._skip = skip_unreadable

    def __call__(self, path: str, shared: bool) -> list[Piece]:
        del shared  # pieces are record ranges either way
        return record_pieces.pieces(path, self._sizes.get(path), skip_unreadable=self._skip)


class _ReadRecordsFn(SharedItemsFn):
    def __init__(
        self,
        plan: Plan,
        batch_size: int,
        *,
        strict: bool,
        skip_unreadable: bool,
        claims: str | None,
    ) -> None:
        super().__init__(claims)
        self._plan = plan
        self._batch_size = batch_size
        self._strict = strict
        self._skip = skip_unreadable
        self._ahead = ReadAhead()

    def setup(self) -> None:
        super().setup()
        self._items_read = Metrics.counter("recordforge", "record_work_items")
        self._decoder = ExampleDecoder(self._plan)

    def teardown(self) -> None:
        self._ahead.close()

    def read(self, piece: Piece, claims: Claims | None) -> Iterator[object]:
        if piece.error:
            yield unreadable(piece.path, piece.error)
            return
        self._items_read.inc()
        rows = 0
        # Records are framed up to protobuf's own limit: one over --max_record_bytes is a bad
        # row of rule record_size (ToExamples), not a damaged file.
        spans = record_pieces.read_piece(piece, max_records=self._batch_size)
        try:
            for span in self._ahead(spans):
                decoded = self._decoder.decode(span.data, span.starts, span.ends)
                for bad in decoded.bad:
                    yield self._bad_record(piece.path, span.first, bad, span)
                # Rejected records never become rows: each run of good records between them is a
                # batch whose first_row is its first record's number, so rows stay numbered.
                good = decoded.rows
                cuts = [0, *(np.flatnonzero(np.diff(good) != 1) + 1).tolist(), len(good)]
                for a, b in zip(cuts, cuts[1:], strict=False):
                    if b > a:
                        yield SourceBatch(
                            piece.path,
                            span.first + int(good[a]),
                            decoded.batch.slice(a, b - a),
                            conformed=True,
                            records=decoded.records.slice(a, b - a),
                        )
                rows += len(span)
        except CorruptRecords as exn:
            if not self._skip:
                raise
            yield unreadable(piece.path, str(exn.what), rows_read_before=rows)

    def _bad_record(self, path: str, first: int, bad: BadRecord, span: record_pieces.Span) -> object:
        from recordforge.conforming.conform import BadRow
        from recordforge.transforms.rejects import rejected_line

        raw = bytes(span.data[int(span.starts[bad.index]) : int(span.ends[bad.index])])
        row = BadRow(path, first + bad.index + 1, bad.column or "*", EXAMPLE, bad.reason, None)
        if self._strict:
            raise row.error()
        return beam.pvalue.TaggedOutput(REJECTED, rejected_line(row, {"record": raw}))


class ReadRecords(beam.PTransform):
    """Reads TFRecord (any compression) or ArrayRecord files of tf.train.Examples.

    In: a PBegin. Out: {"batches": `SourceBatch`es of at most `batch_size` records, already in
    the plan's Arrow schema (`conformed`), each with its records' bytes where they pass through
    unchanged; "rejected": JSON lines of records that are not Examples of the schema (rule
    `example`: `row` the record's 1-based number in its file, `record` its bytes; with `strict`
    the first fails the pipeline); "unreadable": JSON lines}. A record whose frame or CRC fails
    fails the pipeline naming the file and record, or with `skip_unreadable` ends its piece,
    listed in "unreadable". Large uncompressed files are read as record ranges by all workers
    (records/record_pieces.py), each counted in the `recordforge/record_work_items` metric.
    """

    def __init__(
        self,
        patterns: list[str],
        plan: Plan,
        *,
        batch_size: int = 16384,
        expanded: list[FileInfo] | None = None,
        strict: bool = False,
        skip_unreadable: bool = False,
        traits: RunnerTraits,
    ) -> None:
        super().__init__()
        if plan.schema.sequence is not None:
            raise ValueError("SequenceExamples are not read as a source")
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._plan = plan
        self._batch_size = batch_size
        self._strict = strict
        self._skip = skip_unreadable
        self._traits = traits

    @property
    def files(self) -> list[FileInfo]:
        return self._files

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        read_fn = _ReadRecordsFn(
            self._plan,
            self._batch_size,
            strict=self._strict,
            skip_unreadable=self._skip,
            claims=self._traits.claims,
        )
        sizes = {f.path: f.size for f in self._files}
        listing = ("Pieces", _Pieces(sizes, self._skip))
        paths = [f.path for f in self._files]
        items, extra = known_items(pbegin, read_fn, paths, self._traits, label="Files", expand=listing)
        # Piece: records of one file (a byte range, a range of indexes, or the whole file)
        read = items | "Read" >> beam.ParDo(read_fn, *extra).with_outputs(
            UNREADABLE, REJECTED, main="batches"
        )
        batches = declare_element_type(read.batches, SourceBatch)
        return {"batches": batches, UNREADABLE: read[UNREADABLE], REJECTED: read[REJECTED]}
