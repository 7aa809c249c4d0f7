"""Randomness for the privacy core: a CSPRNG in production, a seeded generator for tests only.

Every sampler in :mod:`dasflow.privacy.samplers` takes one of the generators below and uses only the integer
primitives defined here (uniform 32- and 64-bit words, uniform bits, uniform integers in ``[0, n)``); no
sampler ever sees a floating-point random number.

* :func:`csprng` – production. Every byte comes from OpenSSL's DRBG (``ssl.RAND_bytes``: NIST SP 800-90A
  CTR_DRBG with AES-256, seeded from the operating system's entropy source and reseeded by OpenSSL on a schedule
  and after every ``fork``), read in one call per request and viewed as an array with ``np.frombuffer``. Nothing
  is buffered in dasflow between calls, and OpenSSL reseeds a forked child before its first output, so a forked
  worker process never replays bytes its parent handed out. Why not ``os.urandom``: the kernel's ``getrandom(2)``
  delivers ≈ 300 MB/s here against ≈ 1.3 GB/s for the DRBG, and the exact samplers use ≈ 11 bytes per discrete
  Gaussian sample, so the system call was more than half of a production sample's cost (at σ = 304: 49.5 →
  22.9 ns per sample, 20.2 → 43.6 M samples per CPU-second; ``benchmarks/samplers.py``, session 16). Both
  are cryptographically secure generators seeded by the kernel; the DRBG is what OpenSSL-backed DP libraries
  draw from.
* :func:`seeded` – tests and benchmarks only. numpy's PCG64 bit generator (its raw 64-bit output stream,
  which numpy keeps stable across releases) keyed by a SHA-256 digest of the seed. A release drawn with it
  must be marked as a test release; ``.mode`` says which kind a generator is, and callers record it with every
  measurement.

``spawn(key)`` returns an independent child generator for one measurement key. In test mode the child is a
pure function of ``(seed, key path)``: ``digest_child = SHA-256(digest_parent || key UTF-8)``, with the root
digest ``SHA-256("dasflow.rng.seeded/v1:" || decimal seed)``. It does not depend on how much the parent has
drawn, so a resumed release redraws identical noise for the same measurement key. In production a child is
simply another CSPRNG reader (fresh, unpredictable randomness; the key is kept for the record only).
"""

from __future__ import annotations

import hashlib
import ssl
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "MODE_PRODUCTION",
    "MODE_TEST",
    "CSPRNGGenerator",
    "Generator",
    "SeededGenerator",
    "csprng",
    "seeded",
]

Mode = Literal["production", "test"]
MODE_PRODUCTION: Final = "production"
MODE_TEST: Final = "test"

_U64 = np.dtype("<u8")
_U32 = np.dtype("<u4")
_SEED_DOMAIN: Final = b"dasflow.rng.seeded/v1:"
_REQUEST_MAX: Final = 1 << 30  # bytes per RAND_bytes call (OpenSSL takes an int; larger requests are split)
SOURCE: Final = "OpenSSL CTR_DRBG (AES-256), seeded by the OS"  # the production source, as certificates name it


def _as_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or int(size) < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    return int(size)


class Generator:
    """Base class of dasflow generators: exact integer randomness on top of a byte / 64-bit-word source.

    Subclasses implement :meth:`uint64` (i.i.d. uniform words) and :meth:`random_bytes`; everything else is
    derived here with exact integer arithmetic.
    """

    mode: Mode
    key: str

    def uint64(self, size: int) -> npt.NDArray[np.uint64]:
        """``size`` i.i.d. uniform integers in ``[0, 2**64)``."""
        raise NotImplementedError

    def random_bytes(self, n: int) -> bytes:
        """``n`` i.i.d. uniform bytes."""
        raise NotImplementedError

    def spawn(self, key: str) -> Generator:
        """An independent child generator for measurement ``key`` (see the module docstring)."""
        raise NotImplementedError

    # --------------------------------------------------------------------------------------------------------
    def uint32(self, size: int) -> npt.NDArray[np.uint32]:
        """``size`` i.i.d. uniform integers in ``[0, 2**32)`` (the halves of ``ceil(size/2)`` uniform
        words)."""
        n = _as_size(size)
        words = self.uint64((n + 1) // 2).astype(_U64, copy=False)
        return words.view(_U32)[:n].astype(np.uint32, copy=False)

    def word(self) -> int:
        """One uniform integer in ``[0, 2**64)`` as a Python int (for scalar exact fallbacks)."""
        return int(self.uint64(1)[0])

    def bits(self, size: int) -> npt.NDArray[np.uint8]:
        """``size`` i.i.d. fair bits (0/1 as uint8): the bits of ``ceil(size/8)`` uniform bytes."""
        n = _as_size(size)
        raw = np.frombuffer(self.random_bytes((n + 7) // 8), dtype=np.uint8)
        return np.unpackbits(raw, count=n)

    def randbelow(self, n: int) -> int:
        """One uniform integer in ``[0, n)`` for any Python int ``n >= 1``, exactly (no modulo bias).

        Rejection sampling: draw ``k = bit_length(n - 1)`` uniform bits (whole words, excess bits discarded)
        and retry until the value is ``< n``. Every accepted value has probability exactly ``1/n``; the
        acceptance probability is ``n / 2**k > 1/2``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        k = (n - 1).bit_length()
        if k == 0:
            return 0
        words = (k + 63) // 64
        while True:
            v = 0
            for w in self.uint64(words):
                v = (v << 64) | int(w)
            v >>= words * 64 - k
            if v < n:
                return v

    def integers(self, n: int, size: int) -> npt.NDArray[np.int64]:
        """``size`` i.i.d. uniform integers in ``[0, n)`` for ``1 <= n <= 2**63``, exactly (no modulo bias).

        Vectorised rejection sampling: each candidate is the top ``k = bit_length(n - 1)`` bits of a uniform
        64-bit word (uniform on ``[0, 2**k)``); candidates ``>= n`` are discarded and redrawn. Accepted values
        are i.i.d. uniform on ``[0, n)`` because ``[0, n)`` is a subset of ``[0, 2**k)`` on which the
        candidate is uniform.
        """
        m = _as_size(size)
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= int(n) <= 2**63:
            raise ValueError(f"n must be an int in [1, 2**63], got {n!r}")
        n = int(n)
        k = (n - 1).bit_length()
        out = np.empty(m, dtype=np.int64)
        if k == 0:
            out[:] = 0
            return out
        shift = np.uint64(64 - k)
        bound = np.uint64(n)
        filled = 0
        while filled < m:
            need = m - filled
            cand = self.uint64(need + need // 2 + 8) >> shift  # acceptance > 1/2; oversample a little
            ok = cand[cand < bound][:need]
            out[filled : filled + ok.size] = ok.astype(np.int64)
            filled += ok.size
        return out

    def __repr__(self) -> str:
        return f"<{type(self).__name__} mode={self.mode!r} key={self.key!r}>"


def _csprng_bytes(n: int) -> bytes:
    """``n`` bytes from OpenSSL's DRBG (``ssl.RAND_bytes``), in requests of at most ``_REQUEST_MAX`` bytes."""
    if n <= _REQUEST_MAX:
        return ssl.RAND_bytes(n)
    return b"".join(ssl.RAND_bytes(min(_REQUEST_MAX, n - i)) for i in range(0, n, _REQUEST_MAX))


class CSPRNGGenerator(Generator):
    """Production randomness: every call reads fresh bytes from OpenSSL's DRBG (no buffering in dasflow)."""

    def __init__(self, key: str = "") -> None:
        self.mode = MODE_PRODUCTION
        self.key = key

    def random_bytes(self, n: int) -> bytes:
        return _csprng_bytes(_as_size(n))

    def uint64(self, size: int) -> npt.NDArray[np.uint64]:
        n = _as_size(size)
        return np.frombuffer(_csprng_bytes(8 * n), dtype=_U64).astype(np.uint64, copy=False)

    def uint32(self, size: int) -> npt.NDArray[np.uint32]:
        n = _as_size(size)
        return np.frombuffer(_csprng_bytes(4 * n), dtype=_U32).astype(np.uint32, copy=False)

    def spawn(self, key: str) -> CSPRNGGenerator:
        if not isinstance(key, str):
            raise ValueError(f"spawn key must be a str, got {key!r}")
        return CSPRNGGenerator(f"{self.key}/{key}" if self.key else key)


class SeededGenerator(Generator):
    """Test/benchmark randomness: PCG64 keyed by a SHA-256 digest; deterministic, NOT for production
    releases."""

    def __init__(self, digest: bytes, key: str = "", seed: int | None = None) -> None:
        if len(digest) != 32:
            raise ValueError("digest must be 32 bytes (SHA-256)")
        self.mode = MODE_TEST
        self.key = key
        self.seed = seed
        self.digest = digest
        self._bitgen = np.random.PCG64(np.random.SeedSequence(int.from_bytes(digest, "big")))

    def uint64(self, size: int) -> npt.NDArray[np.uint64]:
        n = _as_size(size)
        raw = self._bitgen.random_raw(n)
        return np.asarray(raw, dtype=np.uint64)

    def random_bytes(self, n: int) -> bytes:
        m = _as_size(n)
        return self.uint64((m + 7) // 8).astype(_U64, copy=False).tobytes()[:m]

    def spawn(self, key: str) -> SeededGenerator:
        if not isinstance(key, str):
            raise ValueError(f"spawn key must be a str, got {key!r}")
        child = hashlib.sha256(self.digest + key.encode("utf-8")).digest()
        return SeededGenerator(child, f"{self.key}/{key}" if self.key else key, self.seed)


def csprng() -> CSPRNGGenerator:
    """Production generator reading OpenSSL's DRBG (``ssl.RAND_bytes``; seeded by the OS)."""
    return CSPRNGGenerator()


def seeded(seed: int) -> SeededGenerator:
    """Deterministic test generator for ``seed`` (tests and benchmarks only; ``.mode == "test"``)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed must be an int, got {seed!r}")
    digest = hashlib.sha256(_SEED_DOMAIN + str(int(seed)).encode("ascii")).digest()
    return SeededGenerator(digest, "", int(seed))
