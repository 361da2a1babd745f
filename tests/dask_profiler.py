"""The tests' Dask workers run without Dask's sampling profiler.

The profiler calls sys._current_frames() every 10 ms; on CPython 3.11 before 3.11.9 a garbage
collection inside that call can deadlock the worker against a thread that ends (gh-106883): a
test's conversion then waits forever. README's Dask section says the same to users.
"""

from __future__ import annotations

# For workers started as subprocesses (dask's environment variable form) and for LocalCluster.
ENV = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
CONFIG = {"distributed.worker.profile.enabled": False}
