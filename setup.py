"""Stub so that Dataflow's `--setup_file` can build the package; metadata lives in pyproject.toml.

The one extension, recordforge.records._native (encoding, decoding and framing records: _native.c,
_examples.c, _decode.c), is plain C against Python's own headers: building it needs only a C
compiler."""

import setuptools

setuptools.setup(
    ext_modules=[
        setuptools.Extension(
            "recordforge.records._native",
            ["src/recordforge/records/_native.c", "src/recordforge/records/_examples.c", "src/recordforge/records/_decode.c"],
            depends=["src/recordforge/records/_native.h"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
