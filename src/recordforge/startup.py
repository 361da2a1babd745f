"""How the `recordforge` command's own process imports Beam and exits.

A conversion's process pays for two things it never uses; both are skipped only where RecordForge
owns the process (the console script and `python -m recordforge` call `own_process()`), so that a
library caller's imports and heap are left as they are.

- Importing Beam imports integrations a conversion has no use for: pandas (for Beam's DataFrame
  batches) and the BigQuery and Pub/Sub clients, about a third of Beam's import. Beam imports each
  of them only if it can (assumption 11 in pipelines/local_runner.py), so while Beam is imported
  they are reported missing; afterwards they import normally, for whoever asks. On a Beam version
  other than the one checked (`BEAM_VERSION`), Beam is imported whole.
  pyarrow, too, imports pandas at its first conversion of anything (`pa.array`), only to ask
  whether an object is a pandas one; it asks once, so it is asked while pandas is hidden. A pandas
  feature actually used (`to_pandas`, a pandas object converted) imports pandas then, as pyarrow
  does when its first look found none.
- Python's cyclic collector walks every tracked object on each full collection. Beam's import
  makes some 200,000 long-lived objects (TensorFlow's, three times as many), so collections during
  the import, the run and the interpreter's exit walk them again and again, freeing nothing. The
  import runs with the collector paused, then what it made is frozen (`gc.freeze`); the objects
  left at exit are frozen too, as the exit frees them anyway.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.machinery
import os
import re
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType

__all__ = ["BEAM_VERSION", "UNUSED_BY_CONVERSIONS", "before_exit", "heavy_imports", "own_process"]

# The Beam minor version whose internals RecordForge relies on (local_runner.py, dask_runner.py).
BEAM_VERSION = "2.77"
# Modules Beam imports only if it can, and that a conversion never uses.
UNUSED_BY_CONVERSIONS = ("pandas", "apache_beam.io.gcp.bigquery", "apache_beam.io.gcp.pubsub")

_owned = False


def own_process() -> None:
    """Declares that this process runs one RecordForge command and exits."""
    global _owned
    _owned = True


class _Unavailable:
    """A finder for sys.meta_path that reports the named modules as not installed (a plain class:
    importlib.abc alone takes longer to import than the commands that run no pipeline can spare)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in self._names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _installed_beam_version() -> str | None:
    """Read from Beam's version.py without importing Beam (importlib.metadata takes ~50 ms)."""
    spec = importlib.machinery.PathFinder.find_spec("apache_beam")
    if spec is None or not spec.origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            found = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", f.read(), re.M)
    except OSError:
        return None
    return found.group(1) if found else None


def _beam_can_be_lean() -> bool:
    if "apache_beam" in sys.modules:
        return False  # already imported whole
    version = _installed_beam_version()
    return version is not None and version.startswith(BEAM_VERSION + ".")


@contextlib.contextmanager
def heavy_imports() -> Iterator[None]:
    """Wraps the import of Beam and the pipeline modules (see the module docstring)."""
    if not _owned:
        yield
        return
    unavailable = (
        _Unavailable(tuple(n for n in UNUSED_BY_CONVERSIONS if n not in sys.modules))
        if _beam_can_be_lean()
        else None
    )
    enabled = gc.isenabled()
    gc.disable()
    if unavailable is not None:
        sys.meta_path.insert(0, unavailable)
    try:
        yield
        if unavailable is not None and "pyarrow" in sys.modules:
            sys.modules["pyarrow"].array([0])  # pyarrow's one look for pandas (see above)
    finally:
        if unavailable is not None:
            sys.meta_path.remove(unavailable)
        gc.freeze()
        if enabled:
            gc.enable()


def before_exit() -> None:
    """Called last, just before the process exits (see the module docstring)."""
    if _owned:
        gc.freeze()
