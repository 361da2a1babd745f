"""WebDataset shards: tar files of samples, one per record, members `<key>.<feature>.<ext>`.

A sample is the record's tf.train.Example written member by member (docs/webdataset.md):

    member      = header(512) data pad-to-512        ustar/pax header, mtime 0, uid/gid 0, mode 0644
    sample      = member*                            one per present feature, by member name
    shard       = sample* zero(1024)                 the end-of-archive marker

`__key__` is the record's place in its source (a digest of the file and the row), unique within
an output. A feature is named in a member with `/` as `:` (the image parts, `img:height`).
Each member decodes with `webdataset`'s default decoders to the value the schema gives it:

    .cls   int64 scalars (and `as: scaled_int` decimals: the scaled integer)   -> int
    .txt   string scalars, `as: string` decimals                                -> str
    .bin   bytes scalars                                                        -> bytes
    .jpg .png ...  images, their encoded bytes as the bundle holds them        -> bytes
    .json  string lists                                                         -> list[str]
    .pyd   bytes lists (pickled list of bytes)                                  -> list[bytes]
    .npy   everything else, in its dtype and shape: float32, float64 (`encode: bytes`; a
           `narrow` float64 is the float32 the bundle holds), bool, int64 lists and fixed shapes,
           timestamps as datetime64[unit], dates as datetime64[D], times as timedelta64[unit]

An absent feature has no member. The mapping back (`example_of`) reads the member's extension and
the array's dtype alone, and gives the Example's bytes exactly as the encoder wrote them.
"""

from recordforge.records.webdataset.codec import SampleCodec
from recordforge.records.webdataset.members import (
    END_OF_ARCHIVE,
    MIME,
    SUFFIX,
    WEBDATASET,
    Member,
    sample_bytes,
    sample_key,
    webdataset_facts,
)
from recordforge.records.webdataset.reading import example_of, read_examples, read_samples

__all__ = [
    "END_OF_ARCHIVE",
    "MIME",
    "SUFFIX",
    "WEBDATASET",
    "Member",
    "SampleCodec",
    "example_of",
    "read_examples",
    "read_samples",
    "sample_bytes",
    "webdataset_facts",
    "sample_key",
]
