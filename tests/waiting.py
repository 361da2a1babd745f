"""wait_until: a test's wait for something another thread does, with a deadline, not a guessed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether `condition()` became true within `timeout` seconds (polled every millisecond)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
