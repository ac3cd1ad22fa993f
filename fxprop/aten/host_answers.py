"""The host kernels' answers about calls asked on stand-ins, kept for the process."""
from __future__ import annotations

import threading
from typing import Any, Callable, Hashable


class HostAnswers:
    """Answers by key (everything the answer depends on: the op, the stand-ins' sizes, dtypes or
    layouts, the other arguments), asked of the host once each. Bounded, the oldest answer leaving
    first, and safe across threads (two threads may both ask; both get the same answer)."""

    def __init__(self, limit: int):
        self._limit = limit
        self._answers: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, ask: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._answers:
                return self._answers[key]
        answer = ask()
        with self._lock:
            if len(self._answers) >= self._limit:
                self._answers.pop(next(iter(self._answers)))
            self._answers[key] = answer
        return answer
