"""TopDown's neighbouring relation (``TopDownPlugin.relation``): change one record, converted exactly.

TopDown is calibrated under change-one-record. Every key is a set of marginals (a partition of the records into
cells) per geounit with Δ₁ = Δ₂² = 2; adding or removing one person moves one cell of each marginal by 1,
Δ₁ = Δ₂² = 1: ρ × 1/2, ε × 1/2 under add/remove-person. The invariants it releases exactly (total and state
populations, block facts) are covered by neither relation and are listed as such. Checked by neighbour
enumeration in ``tests/privacy_accounting/test_relations.py``.
"""

from __future__ import annotations

from fractions import Fraction

from dasflow.errors import LedgerRefusal
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.privacy.relations import ADD_REMOVE, CHANGE_ONE, Conversion, ProductRelation


def convert(spec: MeasurementSpec, account: str) -> Conversion:
    """A TopDown key's conversion from change-one-record to the account's relation."""
    if account == CHANGE_ONE:
        return Conversion(CHANGE_ONE, account, Fraction(1), Fraction(1), "same relation")
    if account == ADD_REMOVE:
        return Conversion(CHANGE_ONE, account, Fraction(1, 2), Fraction(1, 2),
                          "marginals: add/remove moves one cell by 1 (Δ₁ = Δ₂² = 1 vs 2)")
    raise LedgerRefusal(f"topdown: no conversion to {account}")


RELATION = ProductRelation(CHANGE_ONE, convert,
                           ("total population", "state populations", "block facts (structural zeros)"))
