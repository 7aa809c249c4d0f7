"""Set the OpenBLAS thread count of the BLAS libraries numpy and scipy loaded (no extra dependency).

The dual solver of Program 1 is a long sequence of mat-vecs, which are memory-bound: on a shared 2-core
machine a threaded BLAS spins and runs them 10-30x slower than one thread (measured).
``single_threaded_blas()`` pins every loaded OpenBLAS to one thread for such a loop and restores the previous
count afterwards; dense factorisations (``eigh``) keep the default. If no OpenBLAS symbol is found this is a
no-op."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")
_lock = threading.Lock()


def _libraries() -> list[tuple[ctypes.CDLL, str]]:
    paths: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and "openblas" in parts[-1].lower() and ".so" in parts[-1]:
                    paths.add(parts[-1])
    except OSError:
        return []
    found: list[tuple[ctypes.CDLL, str]] = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                name = f"{prefix}_get_num_threads{suffix}"
                if hasattr(lib, name) and hasattr(lib, f"{prefix}_set_num_threads{suffix}"):
                    found.append((lib, f"{prefix}_%s_num_threads{suffix}"))
                    break
            else:
                continue
            break
    return found


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the block with every loaded OpenBLAS limited to one thread."""
    with _lock:
        libs = _libraries()
        saved = []
        for lib, pattern in libs:
            get = getattr(lib, pattern % "get")
            get.restype = ctypes.c_int
            saved.append(int(get()))
            getattr(lib, pattern % "set")(ctypes.c_int(1))
    try:
        yield
    finally:
        with _lock:
            for (lib, pattern), n in zip(libs, saved, strict=True):
                getattr(lib, pattern % "set")(ctypes.c_int(n))
