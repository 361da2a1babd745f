"""`make demo` (`python -m demo`): generate the sample taxi data and digits, convert them, read them back."""

from __future__ import annotations

import argparse
import logging
import os
import pprint

import pyarrow.parquet as pq

from demo.digits import ensure_digit_folder
from demo.sampledata import taxi_table
from recordforge.pipelines.convert import run

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--workdir", default="out/demo")
    parser.add_argument("--schema", default="examples/taxi.yaml")
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not os.environ.get("RECORDFORGE_DEBUG"):
        from recordforge.runners.quiet import silence_tensorflow_import

        silence_tensorflow_import()

    data = os.path.join(args.workdir, "data")
    os.makedirs(data, exist_ok=True)
    half = args.rows // 2
    for i, (n, first) in enumerate([(half, 0), (args.rows - half, half)]):
        pq.write_table(
            taxi_table(n, seed=i, first_id=first), f"{data}/taxi-{i:05d}.parquet", row_group_size=5000
        )
    output = os.path.join(args.workdir, "taxi")
    meta = run(
        [
            "--source",
            f"{data}/*.parquet",
            "--schema",
            args.schema,
            "--output",
            output,
            "--overwrite",
        ]
    )
    print(f"\nConverted {meta['rows_read']} rows from {len(meta['sources'])} Parquet files:")
    print(
        f"  output:  {output}/ ({len(meta['shards'])} shards, "
        f"{sum(s['bytes'] for s in meta['shards'])} bytes, {meta['compression']})"
    )
    for shard in meta["shards"]:
        print(f"    {shard['file']}: {shard['records']} records")
    print(f"  records: {meta['num_records']} written, {meta['rows_rejected']} rejected")
    print("  bundle:  schema.pbtxt, schema.yaml, feature_spec.json, metadata.json, _SUCCESS")

    import recordforge

    ds = recordforge.read(output)
    first = next(iter(ds.take(1)))
    print("\nFirst record, read back with recordforge.read() (tf.data + tf.io.parse_example):")
    pprint.pprint({k: _show(v) for k, v in sorted(first.items())}, width=100)
    total = sum(1 for _ in ds)
    print(f"\nRead back {total} records.")

    # An MNIST-shaped folder of PNGs: labels from folder names, original bytes kept.
    digits = os.path.join(args.workdir, "digits")
    ensure_digit_folder(digits, per_class=10)
    photos = os.path.join(args.workdir, "digits-tfrecords")
    meta = run(["--format", "images", "--source", digits, "--output", photos, "--overwrite"])
    grid = os.path.join(args.workdir, "digits-grid.png")
    recordforge.image_grid(photos, grid, n=16)
    print(
        f"\nConverted {meta['num_records']} images ({len(meta['labels'])} labels, splits "
        f"{meta['splits']}, compression {meta['compression']}) to {photos}/; grid: {grid}"
    )
    for out in (output, photos):
        problems = recordforge.verify(out)
        print(f"recordforge verify {out}: {'OK' if not problems else problems}")
    print("\nNext: README.md, 'A five-minute tour'.")


def _show(value: object) -> object:
    import tensorflow as tf

    if isinstance(value, tf.SparseTensor):
        value = value.values
    value = value.numpy()
    return value.tolist() if hasattr(value, "tolist") else value


if __name__ == "__main__":
    main()
