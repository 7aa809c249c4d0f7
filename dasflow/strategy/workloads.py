"""Workloads and reference strategies: dense, sparse and implicit (Kronecker / union of Kronecker) forms.

Everything downstream of a workload needs only its Gram ``G = WᵀW`` (error, bound and Eigen-Design all depend
on W through G, spec §1), its number of rows m and of cells n. Implicit workloads compute G without
materialising W: all ranges have ``G_ij = (min(i,j)+1)(n − max(i,j))`` (0-based: the ranges containing both
cells), and a Kronecker product has ``G = ⊗ G_i``, so a k-way marginal or range-marginal workload over a
multi-attribute histogram never builds its rows. Cells are numbered in row-major (C) order of the attribute
shape."""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "DenseWorkload",
    "GramWorkload",
    "KronWorkload",
    "SparseWorkload",
    "UnionWorkload",
    "Workload",
    "all_marginals",
    "all_range",
    "fig1_workload",
    "haar",
    "hierarchical",
    "identity",
    "kron_strategy",
    "marginals",
    "permuted_range",
    "prefix",
    "random_predicates",
    "range_marginals",
    "total",
]


class Workload(ABC):
    """A linear workload over ``cells`` cells with ``rows`` queries."""

    name: str = "workload"

    @property
    @abstractmethod
    def cells(self) -> int: ...

    @property
    @abstractmethod
    def rows(self) -> int: ...

    @abstractmethod
    def gram(self) -> FloatArray:
        """G = WᵀW, dense n × n."""

    def matrix(self) -> FloatArray:
        """The rows of W, dense m × n (only for workloads small enough to materialise)."""
        raise NotImplementedError(f"{type(self).__name__} is implicit: it has no materialised rows")


class DenseWorkload(Workload):
    """An explicit m × n matrix."""

    def __init__(self, W: npt.ArrayLike, name: str = "dense") -> None:
        self.W = np.atleast_2d(np.asarray(W, dtype=np.float64))
        self.name = name

    @property
    def cells(self) -> int:
        return int(self.W.shape[1])

    @property
    def rows(self) -> int:
        return int(self.W.shape[0])

    def gram(self) -> FloatArray:
        return np.asarray(self.W.T @ self.W, dtype=np.float64)

    def matrix(self) -> FloatArray:
        return self.W


class SparseWorkload(Workload):
    """A scipy sparse m × n matrix (e.g. many 0/1 predicate rows)."""

    def __init__(self, W: sp.spmatrix | sp.sparray, name: str = "sparse") -> None:
        self.W = sp.csr_array(W, dtype=np.float64)
        self.name = name

    @property
    def cells(self) -> int:
        return int(self.W.shape[1])

    @property
    def rows(self) -> int:
        return int(self.W.shape[0])

    def gram(self) -> FloatArray:
        return np.asarray((self.W.T @ self.W).toarray(), dtype=np.float64)

    def matrix(self) -> FloatArray:
        return np.asarray(self.W.toarray(), dtype=np.float64)


class GramWorkload(Workload):
    """A workload known through its Gram only (closed forms such as all ranges)."""

    def __init__(self, G: npt.ArrayLike, rows: int, name: str = "gram") -> None:
        self.G = np.asarray(G, dtype=np.float64)
        self._rows = int(rows)
        self.name = name

    @property
    def cells(self) -> int:
        return int(self.G.shape[0])

    @property
    def rows(self) -> int:
        return self._rows

    def gram(self) -> FloatArray:
        return self.G


class KronWorkload(Workload):
    """W = W_1 ⊗ … ⊗ W_k (one factor per attribute); G = G_1 ⊗ … ⊗ G_k."""

    def __init__(self, factors: Sequence[Workload], name: str = "kron") -> None:
        if not factors:
            raise ValueError("a Kronecker workload needs at least one factor")
        self.factors = list(factors)
        self.name = name

    @property
    def cells(self) -> int:
        return math.prod(f.cells for f in self.factors)

    @property
    def rows(self) -> int:
        return math.prod(f.rows for f in self.factors)

    def gram(self) -> FloatArray:
        G: FloatArray = np.ones((1, 1))
        for f in self.factors:
            G = np.asarray(np.kron(G, f.gram()), dtype=np.float64)
        return G

    def matrix(self) -> FloatArray:
        W: FloatArray = np.ones((1, 1))
        for f in self.factors:
            W = np.asarray(np.kron(W, f.matrix()), dtype=np.float64)
        return W

    def factor_grams(self) -> list[FloatArray]:
        return [f.gram() for f in self.factors]


class UnionWorkload(Workload):
    """The stacked rows of several workloads (e.g. all 2-way marginals), optionally weighted."""

    def __init__(self, parts: Sequence[Workload], weights: Sequence[float] | None = None,
                 name: str = "union") -> None:
        if not parts:
            raise ValueError("a union workload needs at least one part")
        cells = {p.cells for p in parts}
        if len(cells) != 1:
            raise ValueError(f"union parts disagree on the number of cells: {sorted(cells)}")
        self.parts = list(parts)
        self.weights = [1.0] * len(parts) if weights is None else [float(w) for w in weights]
        self.name = name

    @property
    def cells(self) -> int:
        return self.parts[0].cells

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def gram(self) -> FloatArray:
        return np.asarray(sum(w * w * p.gram() for w, p in zip(self.weights, self.parts, strict=True)),
                          dtype=np.float64)

    def matrix(self) -> FloatArray:
        return np.vstack([w * p.matrix() for w, p in zip(self.weights, self.parts, strict=True)])


# --- named workloads ---------------------------------------------------------------------------------------


def identity(n: int) -> DenseWorkload:
    return DenseWorkload(np.eye(n), name=f"identity({n})")


def total(n: int) -> DenseWorkload:
    return DenseWorkload(np.ones((1, n)), name=f"total({n})")


def all_range(n: int) -> GramWorkload:
    """All n(n+1)/2 contiguous ranges of a 1-D ordered domain (implicit: closed-form Gram)."""
    i = np.arange(n, dtype=np.float64)
    lo = np.minimum.outer(i, i)
    hi = np.maximum.outer(i, i)
    return GramWorkload((lo + 1.0) * (n - hi), rows=n * (n + 1) // 2, name=f"all_range({n})")


def all_range_matrix(n: int) -> DenseWorkload:
    """All ranges as explicit rows (small n only; for tests of the implicit form)."""
    rows = [(a, b) for a in range(n) for b in range(a, n)]
    W = np.zeros((len(rows), n))
    for r, (a, b) in enumerate(rows):  # loop over queries (≤ n²/2), test-size only
        W[r, a:b + 1] = 1.0
    return DenseWorkload(W, name=f"all_range_matrix({n})")


def prefix(n: int) -> DenseWorkload:
    """The CDF workload: the n prefix ranges [0, i]."""
    return DenseWorkload(np.tril(np.ones((n, n))), name=f"prefix({n})")


def permuted_range(n: int, seed: int) -> GramWorkload:
    """All ranges over a randomly permuted domain (Table 2 "1D Range (Permuted)"); fixed seed."""
    perm = np.random.default_rng(seed).permutation(n)
    G = all_range(n).gram()[np.ix_(perm, perm)]
    return GramWorkload(G, rows=n * (n + 1) // 2, name=f"permuted_range({n},{seed})")


def random_predicates(n: int, m: int, seed: int, density: float = 0.5) -> DenseWorkload:
    """m random 0/1 predicate queries, each cell included with probability ``density``; fixed seed."""
    W = (np.random.default_rng(seed).random((m, n)) < density).astype(np.float64)
    return DenseWorkload(W, name=f"predicates({n},{m},{seed})")


def _ones_row(d: int) -> DenseWorkload:
    return DenseWorkload(np.ones((1, d)), name=f"total({d})")


def marginals(shape: Sequence[int], k: int) -> UnionWorkload:
    """All k-way marginals over attributes of the given sizes (union of Kronecker products)."""
    parts: list[Workload] = []
    for keep in itertools.combinations(range(len(shape)), k):
        parts.append(KronWorkload([identity(d) if i in keep else _ones_row(d) for i, d in enumerate(shape)],
                                  name=f"marginal{keep}"))
    return UnionWorkload(parts, name=f"{k}-way marginals {tuple(shape)}")


def all_marginals(shape: Sequence[int]) -> UnionWorkload:
    """Every marginal, k = 0 … #attributes."""
    parts = [p for k in range(len(shape) + 1) for p in marginals(shape, k).parts]
    return UnionWorkload(parts, name=f"all marginals {tuple(shape)}")


def range_marginals(shape: Sequence[int], k: int) -> UnionWorkload:
    """k-way range marginals: all ranges on each of k attributes, summed over the others."""
    parts: list[Workload] = []
    for keep in itertools.combinations(range(len(shape)), k):
        parts.append(KronWorkload([all_range(d) if i in keep else _ones_row(d) for i, d in enumerate(shape)],
                                  name=f"range_marginal{keep}"))
    return UnionWorkload(parts, name=f"{k}-way range marginals {tuple(shape)}")


def fig1_workload() -> DenseWorkload:
    """Fig. 1(b) of the paper: 8 cells (gender M/F × 4 gpa classes), 8 queries; row 2 counts males (0(d))."""
    W = np.array([
        [1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 1],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 0, 1, 1],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, -1, -1, -1, -1],
    ], dtype=np.float64)
    return DenseWorkload(W, name="fig1")


# --- reference strategies (competitors) -------------------------------------------------------------------


def haar(n: int) -> FloatArray:
    """Unnormalised Haar wavelet strategy (0/±1 rows): the total, then per dyadic block left − right half."""
    if n < 1 or n & (n - 1):
        raise ValueError("Haar needs n a power of two")
    rows = [np.ones(n)]
    size = n
    while size >= 2:
        for start in range(0, n, size):
            r = np.zeros(n)
            r[start:start + size // 2] = 1.0
            r[start + size // 2:start + size] = -1.0
            rows.append(r)
        size //= 2
    return np.array(rows)


def hierarchical(n: int, branching: int = 2) -> FloatArray:
    """Unweighted hierarchical (tree of ranges) 0/1 strategy: every node's range, root to leaves."""
    rows = []
    size = n
    while True:
        for start in range(0, n, size):
            r = np.zeros(n)
            r[start:min(start + size, n)] = 1.0
            rows.append(r)
        if size == 1:
            break
        size = max(1, math.ceil(size / branching))
    return np.unique(np.array(rows), axis=0)


def kron_strategy(factors: Sequence[npt.ArrayLike]) -> FloatArray:
    """Per-attribute strategy product (the multi-dimensional Wavelet/Hierarchical competitors)."""
    A: FloatArray = np.ones((1, 1))
    for f in factors:
        A = np.asarray(np.kron(A, np.asarray(f, dtype=np.float64)), dtype=np.float64)
    return A


def sparse_from_dense(W: npt.ArrayLike) -> SparseWorkload:
    return SparseWorkload(sp.csr_array(np.asarray(W, dtype=np.float64)))
