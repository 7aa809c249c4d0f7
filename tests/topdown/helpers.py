"""Shared fixtures for the TopDown tests: hand-made spines, small geographies, a dense WLS variance oracle."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pandas as pd

from dasflow.products.topdown.spine import Spine


def make_spine(parents: Sequence[Sequence[int]], beta: Sequence[Fraction], rule: str = "zcdp") -> Spine:
    """A spine from parent lists (``parents[i]`` = parents of the units of level i+1, non-decreasing)."""
    import math

    par = [np.array([-1], dtype=np.int64)] + [np.asarray(p, dtype=np.int64) for p in parents]
    den = math.lcm(*[b.denominator for b in beta])
    gam = [np.full(p.shape[0], int(beta[l] * den), dtype=np.int64) for l, p in enumerate(par)]
    labels = [np.array([f"L{l}U{u}" for u in range(p.shape[0])], dtype=object) for l, p in enumerate(par)]
    nb = par[-1].shape[0]
    geoid = np.array([f"01001{b:06d}1{b:03d}" for b in range(nb)], dtype=object)
    return Spine(levels=tuple(f"L{l}" for l in range(len(par))), parent=par, gamma_num=gam, denominator=den,
                 labels=labels, block_geoid=geoid, block_source_row=np.arange(nb, dtype=np.int64),
                 beta=tuple(beta), privacy_rule=rule, bypassed=[0] * len(par))


def random_parents(rng: np.random.Generator, fanouts: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Random balanced tree: level sizes from per-level fanout ranges [lo, hi]."""
    out: list[list[int]] = []
    n = 1
    for lo, hi in fanouts:
        f = rng.integers(lo, hi + 1, size=n)
        out.append(list(np.repeat(np.arange(n), f)))
        n = int(f.sum())
    return out


def block_indicators(spine: Spine, level: int) -> np.ndarray:
    """A[l]: units × blocks 0/1."""
    bu = spine.block_unit[level]
    a = np.zeros((spine.n_units(level), bu.size))
    a[bu, np.arange(bu.size)] = 1.0
    return a


def wls_var_diag(B: np.ndarray, W: np.ndarray, A_rows: np.ndarray, gamma: np.ndarray, alpha: np.ndarray,
                 gaussian: bool, budget: float = 1.0) -> np.ndarray:
    """diag(V (S̃ᵀS̃)⁻¹ Vᵀ) with V = B⊗W and S̃ = (diag(√γ or γ) A) ⊗ (diag(√(αρ) or αε) W) (eq 19)."""
    V = np.kron(B, W)
    if gaussian:
        S = np.kron(np.diag(np.sqrt(gamma)) @ A_rows, np.diag(np.sqrt(alpha * budget)) @ W)
        scale = 1.0
    else:
        S = np.kron(np.diag(gamma) @ A_rows, np.diag(alpha * budget) @ W)
        scale = 2.0
    cov = np.linalg.inv(S.T @ S)
    out: np.ndarray = scale * np.einsum("ij,jk,ik->i", V, cov, V)
    return out


def measured_rows(spine: Spine) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the strategy A (measured units only) and their γ (floats)."""
    rows, gam = [], []
    for l in range(spine.n_levels):
        a = block_indicators(spine, l)
        g = spine.gamma_num[l] / spine.denominator
        keep = g > 0
        rows.append(a[keep])
        gam.append(g[keep])
    return np.vstack(rows), np.concatenate(gam)


def all_rows(spine: Spine) -> np.ndarray:
    return np.vstack([block_indicators(spine, l) for l in range(spine.n_levels)])


def small_geography(seed: int = 1, states: Sequence[str] = ("01",), counties: int = 3, tracts: int = 5,
                    max_blocks: int = 25) -> pd.DataFrame:
    """Random GRF-C-like block table with AIAN areas, places, MCDs and GQ types."""
    r = np.random.default_rng(seed)
    rows = []
    for st in states:
        for c in range(counties):
            cty = f"{2 * c + 1:03d}"
            for tr in range(tracts):
                nb = int(r.integers(1, max_blocks + 1))
                for b in range(nb):
                    rows.append({
                        "GEOID": f"{st}{cty}{tr + 100:06d}{b % 3 + 1}{b:03d}",
                        "AIANNHCE": str(r.choice([9999, 9999, 9999, 120, 5600, 8100])),
                        "PLACEFP": str(r.choice(["99999", "12345", "22222"])),
                        "COUSUBFP": str(r.choice(["10000", "20000"])),
                        "GQ_TYPES": str(r.choice(["0000000", "0000000", "0100000"])),
                    })
    return pd.DataFrame(rows)
