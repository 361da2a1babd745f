"""The Flex Template's metadata.json, generated from the pipeline's own flags.

`make metadata` writes deploy/metadata.json; a test checks the committed file is up to date.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from recordforge.pipelines.options import ConvertOptions

__all__ = ["template_metadata"]

_LABELS = {
    "source": ("Input file pattern", r"^\S+$"),
    "output": ("Output folder", r"^\S+$"),
    "schema": ("Schema file (YAML or TFMD schema.pbtxt)", r"^\S+$"),
    "format": ("Source format", "^(parquet|csv|images)$"),
    "compression": ("Shard compression", "^(gzip|zlib|none)$"),
    "num_shards": ("Number of shards", "^[0-9]+$"),
    "shard_size": ("Target shard size", r"^[0-9]+(\.[0-9]+)?\s*([KMG]i?B|B)?$"),
    "records_per_shard": ("Records per shard", "^[0-9]+$"),
    "compression_level": ("Deflate level", "^[0-3]$"),
    "sink": ("Sink", "^(fast|beam)$"),
    "batch_size": ("Rows per batch", "^[1-9][0-9]*$"),
    "deterministic": ("Deterministic output", "^(true|false)$"),
    "shuffle": ("Shuffle the records", "^(true|false)$"),
    "seed": ("Shuffle seed", "^-?[0-9]+$"),
    "max_rejected": ("Bad rows allowed", "^[0-9]+$"),
    "max_rejected_fraction": ("Bad rows allowed, as a fraction", r"^(0(\.[0-9]+)?|1(\.0+)?)$"),
    "skip_unreadable_files": ("Skip unreadable files", "^(true|false)$"),
    "splits": ("Splits and weights", r"^[A-Za-z0-9_\-]+=[0-9]+(,[A-Za-z0-9_\-]+=[0-9]+)*$"),
    "split_key": ("Split key feature", r"^\S+$"),
    "split_column": ("Split name column", r"^.+$"),
    "split_salt": ("Split hash salt", r"^.*$"),
    "preprocessing_fn": ("tensorflow-transform preprocessing_fn (module.py:function)", r"^\S+:\w+$"),
    "analyze_split": ("Split the analyzers are fitted on", r"^[A-Za-z0-9_\-]+$"),
    "span": ("Span: latest, YYYY-MM-DD or a number", r"^(latest|\d{4}-\d{2}-\d{2}|\d+)$"),
    "if_changed": ("Skip when unchanged", "^(true|false)$"),
    "overwrite": ("Replace existing output", "^(true|false)$"),
}
_REQUIRED = ("source", "output")


def template_metadata() -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    ConvertOptions._add_argparse_args(parser)
    params = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        label, regex = _LABELS[action.dest]
        params.append(
            {
                "name": action.dest,
                "label": label,
                "helpText": (action.help or "").replace("%%", "%"),  # argparse escapes %
                "isOptional": action.dest not in _REQUIRED,
                "regexes": [regex],
            }
        )
    return {
        "name": "RecordForge convert",
        "description": "Convert Parquet or CSV files to sharded TFRecords of tf.train.Example "
        "with a self-describing bundle.",
        "parameters": params,
    }


if __name__ == "__main__":
    sys.stdout.write(json.dumps(template_metadata(), indent=2) + "\n")
