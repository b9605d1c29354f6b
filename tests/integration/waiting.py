"""Polling for the Ray tests: what a test waits for, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], object], timeout: float = 60.0, every: float = 0.1) -> bool:
    """True as soon as ``pred()`` is; after ``timeout`` seconds, ``pred()``'s last word."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return bool(pred())
