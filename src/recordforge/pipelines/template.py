"""The Flex Template's metadata.json, generated from the flag table (flags.py).

`make metadata` writes deploy/metadata.json; a test checks the committed file is up to date.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from recordforge.pipelines.flags import FLAGS

__all__ = ["template_metadata"]


def template_metadata() -> dict[str, Any]:
    params = [
        {
            "name": f.name,
            "label": f.label,
            "helpText": f.help,
            "isOptional": not f.required,
            "regexes": [f.regex],
        }
        for f in FLAGS
    ]
    return {
        "name": "RecordForge convert",
        "description": "Convert Parquet or CSV files to sharded TFRecords of tf.train.Example "
        "with a self-describing bundle.",
        "parameters": params,
    }


if __name__ == "__main__":
    sys.stdout.write(json.dumps(template_metadata(), indent=2) + "\n")
