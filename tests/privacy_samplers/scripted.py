"""A test generator with scripted first 32-bit decision words, then a seeded stream (forces tie paths)."""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

from dasflow.privacy import rng


class ScriptedGenerator(rng.Generator):
    """``uint32`` returns the scripted words first; every other primitive comes from ``rng.seeded(seed)``."""

    def __init__(self, words: list[int], seed: int = 0) -> None:
        self.mode = "test"
        self.key = "scripted"
        self.queue: deque[int] = deque(words)
        self.rest = rng.seeded(seed)

    def uint32(self, size: int) -> npt.NDArray[np.uint32]:
        out = self.rest.uint32(size).copy()
        for i in range(size):
            if not self.queue:
                break
            out[i] = np.uint32(self.queue.popleft())
        return out

    def uint64(self, size: int) -> npt.NDArray[np.uint64]:
        return self.rest.uint64(size)

    def random_bytes(self, n: int) -> bytes:
        return self.rest.random_bytes(n)

    def spawn(self, key: str) -> rng.Generator:
        return self.rest.spawn(key)
