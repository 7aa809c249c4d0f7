"""The group-size product's neighbouring relation (``GroupSizePlugin.relation``), converted exactly.

The number of households n is public and the plan's relation (:data:`FIXED_HOUSEHOLDS`) lets a person only join
or leave an existing household. Under add/remove-person a person may also form or dissolve a one-person
household, which moves every cumulative entry Λ_j (j = 1..k) of its region: counts Δ = max(2, 1) = 2 (factor 1),
cumulative Δ = max(1, k) (factor k), chain (j-major cumulative over |R| regions) Δ = max(|R|, k|R|) (factor k);
L1 = L2² for these 0/±1 changes, so the ρ and ε factors agree. → change-one-person: twice that in L1, four times
in squared L2. The public n itself is an invariant released exactly. Checked by neighbour enumeration in
``tests/privacy_accounting/test_relations.py``.
"""

from __future__ import annotations

from fractions import Fraction

from dasflow.errors import LedgerRefusal
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.privacy.relations import ADD_REMOVE, CHANGE_ONE, Conversion, ProductRelation

#: the group-size plan's own relation (not an account relation: n is public)
FIXED_HOUSEHOLDS = "add_remove_person_fixed_households"


def groupsize_factor(query: str, k: int) -> Fraction:
    """Sensitivity ratio (L1 = L2²) of a group-size query when a person may also form or dissolve a one-person
    household, over the fixed-household relation the plan is calibrated to (see the module docstring)."""
    if query == "counts":
        return Fraction(1)
    if query in ("cumulative", "chain"):
        return Fraction(k)
    raise LedgerRefusal(f"groupsize: no declared conversion for query {query!r}")


def convert(spec: MeasurementSpec, account: str) -> Conversion:
    """A group-size key's conversion from the fixed-household relation to the account's relation."""
    f = groupsize_factor(str(spec.detail.get("query")), int(spec.detail.get("k", 0)))
    if account == ADD_REMOVE:
        return Conversion(FIXED_HOUSEHOLDS, account, f, f,
                          f"a person forming/dissolving a household: Δ × {f} (L1 = L2²)")
    if account == CHANGE_ONE:
        return Conversion(FIXED_HOUSEHOLDS, account, 4 * f, 2 * f,
                          f"change = remove + add, each up to Δ × {f}: L1 × {2 * f}, L2² × {4 * f}")
    raise LedgerRefusal(f"groupsize: no conversion to {account}")


RELATION = ProductRelation(FIXED_HOUSEHOLDS, convert, ("number of occupied housing units n",))
