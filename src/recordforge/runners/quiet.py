"""TensorFlow imported without its start-up noise.

TensorFlow's C++ side writes lines to file descriptor 2 while it is imported (CUDA stubs, CPU
features, "All log messages before absl::InitializeLog() ..."), before its log level applies;
later lines obey TF_CPP_MIN_LOG_LEVEL. `silence_tensorflow_import` makes the first import of
`tensorflow`, wherever it happens (tensorflow-transform, tf.data, a forked worker), run with
descriptor 2 pointed at /dev/null. The CLI installs it unless --debug.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

__all__ = ["silence_tensorflow_import"]


@contextlib.contextmanager
def _descriptor_2_silenced() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:  # resource readers, is_package, ...: the real one's
        return getattr(self._real, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with _descriptor_2_silenced():
            self._real.exec_module(module)


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the real finders locate it
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def silence_tensorflow_import() -> None:
    """From now on, the first `import tensorflow` of this process (and of processes it forks)
    prints nothing while it runs; TensorFlow's later C++ logs are limited to fatal ones."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlow())
