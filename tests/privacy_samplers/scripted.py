"""A test generator that returns scripted 64-bit words first, then a seeded stream (to force tie paths)."""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

from dasflow.privacy import rng


class ScriptedGenerator(rng.Generator):
    def __init__(self, words: list[int], seed: int = 0) -> None:
        self.mode = "test"
        self.key = "scripted"
        self.queue: deque[int] = deque(words)
        self.rest = rng.seeded(seed)

    def uint64(self, size: int) -> npt.NDArray[np.uint64]:
        out = self.rest.uint64(size)
        for i in range(size):
            if not self.queue:
                break
            out[i] = np.uint64(self.queue.popleft())
        return out

    def random_bytes(self, n: int) -> bytes:
        return self.rest.random_bytes(n)

    def spawn(self, key: str) -> rng.Generator:
        return self.rest.spawn(key)
