"""How the `recordforge` command's own process imports Beam and exits.

A conversion's process pays for two things it never uses; both are skipped only where RecordForge
owns the process (the console script and `python -m recordforge` call `own_process()`), so that a
library caller's imports and heap are left as they are.

- Importing Beam imports the BigQuery and Pub/Sub clients, which a conversion has no use for.
  Beam imports them only if it can (assumption 11 in runners/local_runner.py), so while Beam is
  imported they are reported missing. Afterwards they import normally, for whoever asks, but
  `beam.io` stays without the BigQuery, Pub/Sub and cross-language transforms, none of which a
  conversion uses. (pandas is not hidden: pyarrow would import it at its first conversion anyway,
  and what pyarrow returns for some values, nanosecond timestamps among them, depends on whether
  it found pandas; a conversion's bad-row records must not depend on which process made them.)
  On a Beam version other than the one checked (`BEAM_VERSION`), Beam is imported whole.
- Python's cyclic collector walks every tracked object on each full collection. Beam's import
  makes some 200,000 long-lived objects (TensorFlow's, about twice as many), so collections during
  the import, the run and the interpreter's exit walk them again and again, freeing nothing. The
  imports run with the collector paused, then what they made is frozen (`gc.freeze`: never
  walked again; the few objects that were already garbage then stay until the process ends).
  At exit, one collection of what the run made runs the finalizers of its garbage, then
  everything is frozen, so that the interpreter's own last collections walk nothing.
- Arrow allocates from mimalloc by default, which gives a block freed by another thread than the
  one that allocated it back to that thread's heap only later. A conversion's readers decode on a
  thread of their own (read_ahead.py) and its batches are freed on the encoding thread, so new
  batches kept taking fresh pages. The command's process allocates Arrow's buffers with the
  system allocator (glibc returns such a block to its arena at once), unless
  ARROW_DEFAULT_MEMORY_POOL names one. Output bytes do not depend on it: the command's and the
  library's writes are compared in tests/e2e/test_startup.py.
- numpy's OpenBLAS starts a thread per core as numpy is imported, and each spins a while
  before it sleeps: CPU time taken from the work in every process that imports numpy (the
  command's, an export's workers, a spawned Beam worker), more of it the more cores. RecordForge
  multiplies no matrices, so the command's process asks OpenBLAS for one thread
  (OPENBLAS_NUM_THREADS, unless set), before numpy is first imported.
- Beam works out some answers about the same object hundreds of times while it builds, translates
  and runs a pipeline (a DoFn's state and timer specs, a view of the options); on the Beam version
  checked, the command's process works each out once per object (runners/beam_memos.py).
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
UNUSED_BY_CONVERSIONS = ("apache_beam.io.gcp.bigquery", "apache_beam.io.gcp.pubsub")

_owned = False


def own_process() -> None:
    """Declares that this process runs one RecordForge command and exits."""
    global _owned
    _owned = True
    if "numpy" not in sys.modules:
        # Read once, when numpy loads OpenBLAS; inherited by the processes the command starts.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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
        _system_allocator()
        _remember_beams_answers()
    finally:
        with contextlib.suppress(ValueError):  # already gone: nothing to undo
            if unavailable is not None:
                sys.meta_path.remove(unavailable)
        gc.freeze()
        if enabled:
            gc.enable()


def _system_allocator() -> None:
    """Arrow's buffers from the system allocator (see the module docstring)."""
    if "ARROW_DEFAULT_MEMORY_POOL" in os.environ:
        return
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _remember_beams_answers() -> None:
    beam = sys.modules.get("apache_beam")
    if beam is not None and getattr(beam, "__version__", "").startswith(BEAM_VERSION + "."):
        from recordforge.runners.beam_memos import remember_beams_answers

        remember_beams_answers()


def before_exit() -> None:
    """Called last, just before the process exits (see the module docstring)."""
    if _owned:
        gc.collect()
        gc.freeze()
