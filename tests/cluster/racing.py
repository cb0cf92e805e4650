"""Run callables at the same moment on threads (each with its own store/connection)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def race(calls: Sequence[Callable[[], Any]], timeout: float = 30.0) -> list[Any]:
    """Start every call together (a barrier) and return their results in order; an
    exception a call raised is returned in its place."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def one(i: int) -> None:
        barrier.wait(timeout)
        try:
            results[i] = calls[i]()
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a racing call did not finish"
    return results
