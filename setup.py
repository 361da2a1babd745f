"""Stub so that Dataflow's `--setup_file` can build the package; metadata lives in pyproject.toml."""

import setuptools

setuptools.setup()
