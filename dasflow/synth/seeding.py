"""Seed derivation: every random stream is ``np.random.default_rng(SHA-256(seed, *keys))``.

This is synthetic data, not privacy noise, so numpy's PCG64 is the right tool. Hashing the seed with the state
(and the chunk) makes a state's data independent of which other states are generated, and of generation order.
"""

from __future__ import annotations

import hashlib

import numpy as np


def derive_seed(seed: int, *keys: str | int) -> int:
    """A 128-bit integer from SHA-256 over the seed and keys (unambiguous '|'-joined encoding)."""
    text = "|".join(["dasflow.synth", str(int(seed)), *(str(k) for k in keys)])
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:16], "little")


def stream(seed: int, *keys: str | int) -> np.random.Generator:
    """An independent generator for (seed, keys)."""
    return np.random.default_rng(derive_seed(seed, *keys))
