"""Neighbouring relations: what each product's budget is measured against, and its exact conversion.

A privacy-loss account (``dasflow.privacy.account``) composes budgets under **one** neighbouring relation:

``add_remove_person``   (default) the dataset with one person added or removed, household membership free: the
                        person may join or leave an existing household, or form / dissolve a one-person one.
``change_one_person``   one person's record replaced by any other record (the number of persons fixed).

Each product declares the relation its plan was calibrated under and how its keys' sensitivities change under
the account's relation. For one key with sensitivity Δ under the product's relation and Δ' under the account's,
noise calibrated to Δ at budget b is a mechanism of budget b·(Δ'/Δ)² (zCDP: ρ = Δ²/(2σ²)) or b·(Δ'/Δ)
(pure DP: ε = Δ₁/scale) under the account's relation. The factors below are those ratios (squared-L2 ratio
for ρ, L1 ratio for ε), derived per product and checked by neighbour enumeration in
``tests/privacy_accounting/test_relations.py``; docs/accounts.md has the short proofs.

* PHSafe, SafeTab-P, matrix: add/remove one person. → change-one-person: a change is a removal then an
  addition, so Δ' ≤ 2Δ in every norm (triangle inequality): ρ × 4, ε × 2 (sound for every query; PHSafe).
  SafeTab-P and matrix keys are counts to which a person adds 0 or 1 per entry (≤ s groups; one cell of a
  marginal): a change clears ≤ Δ₁ entries and raises ≤ Δ₁ others by 1, so L1 = L2² at most doubles: ρ × 2, ε × 2.
* TopDown: change one record. Every key is a set of marginals (a partition of the records into cells) per
  geounit with Δ₁ = Δ₂² = 2; adding or removing one person moves one cell of each marginal by 1, Δ₁ = Δ₂² = 1:
  ρ × 1/2, ε × 1/2. The invariants it releases exactly (total and state populations, block facts) are not
  covered by either relation and are listed as such.
* Group sizes: the number of households n is public and the plan's relation lets a person only join or leave
  an existing household. Under add/remove-person a person may also form or dissolve a one-person household,
  which moves every cumulative entry Λ_j (j = 1..k) of its region: counts Δ = max(2, 1) = 2 (factor 1),
  cumulative Δ = max(1, k) (factor k), chain (j-major cumulative over |R| regions) Δ = max(|R|, k|R|) (factor
  k); L1 = L2² for these 0/±1 changes, so the ρ and ε factors agree. → change-one-person: twice that in L1,
  four times in squared L2. The public n itself is an invariant released exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from dasflow.errors import LedgerRefusal
from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec

Relation = Literal["add_remove_person", "change_one_person"]
RELATIONS: tuple[str, ...] = ("add_remove_person", "change_one_person")
ADD_REMOVE: Relation = "add_remove_person"
CHANGE_ONE: Relation = "change_one_person"
#: the group-size plan's own relation (not an account relation: n is public)
FIXED_HOUSEHOLDS = "add_remove_person_fixed_households"

#: a key's sensitivity of the whole measured vector: ("l2sq", Δ₂²) under zCDP, ("l1", Δ₁) under pure DP
Sensitivity = tuple[Literal["l2sq", "l1"], Fraction]


@dataclass(frozen=True)
class Conversion:
    """Budget factors from a product's relation to an account's: ρ' = rho_factor·ρ, ε' = eps_factor·ε."""

    product_relation: str
    account_relation: str
    rho_factor: Fraction
    eps_factor: Fraction
    argument: str

    def budget(self, spec: MeasurementSpec) -> Fraction | None:
        """The key's budget under the account's relation (``None`` stays infinite)."""
        if spec.budget is None:
            return None
        return spec.budget * (self.rho_factor if spec.privacy_defn == "zcdp" else self.eps_factor)


@dataclass(frozen=True)
class ProductRelation:
    """What a product declares: its relation, the conversion of a key to an account relation, and the invariants
    it releases exactly. A key's sensitivity under the product's relation is ``spec.sensitivity`` itself (one
    convention for every product, see :func:`whole_vector_sensitivity`)."""

    relation: str
    convert: Callable[[MeasurementSpec, str], Conversion]
    invariants: tuple[str, ...] = ()


def whole_vector_sensitivity(spec: MeasurementSpec) -> Sensitivity:
    """The key's sensitivity as the ``MeasurementSpec`` convention defines it, for every product: the squared L2
    sensitivity Δ₂² of the whole measured vector under zCDP, its L1 sensitivity Δ₁ under pure DP."""
    return ("l2sq", spec.sensitivity) if spec.privacy_defn == "zcdp" else ("l1", spec.sensitivity)


#: add/remove → change-one for any query: a change is a removal then an addition, Δ' ≤ 2Δ in L1 and L2
GENERIC_CHANGE = (Fraction(4), Fraction(2), "change = remove + add: Δ' ≤ 2Δ (triangle inequality)")
#: ... for a key whose every person-contribution is a set of 0/+1 entries (marginals, SafeTab-P group counts): a
#: change zeroes at most Δ₁ entries and raises at most Δ₁ others, all by 1, so Δ₁' ≤ 2Δ₁ and Δ₂'² ≤ 2Δ₂²
COUNTS_CHANGE = (Fraction(2), Fraction(2), "0/+1 contributions: change moves ≤ 2× the entries by 1 (L1 = L2²)")


def _add_remove(change: tuple[Fraction, Fraction, str]) -> Callable[[MeasurementSpec, str], Conversion]:
    def convert(spec: MeasurementSpec, account: str) -> Conversion:
        if account == ADD_REMOVE:
            return Conversion(ADD_REMOVE, account, Fraction(1), Fraction(1), "same relation")
        if account == CHANGE_ONE:
            return Conversion(ADD_REMOVE, account, change[0], change[1], change[2])
        raise LedgerRefusal(f"{spec.product}: no conversion from {ADD_REMOVE} to {account}")
    return convert


def _topdown_convert(spec: MeasurementSpec, account: str) -> Conversion:
    if account == CHANGE_ONE:
        return Conversion(CHANGE_ONE, account, Fraction(1), Fraction(1), "same relation")
    if account == ADD_REMOVE:
        return Conversion(CHANGE_ONE, account, Fraction(1, 2), Fraction(1, 2),
                          "marginals: add/remove moves one cell by 1 (Δ₁ = Δ₂² = 1 vs 2)")
    raise LedgerRefusal(f"topdown: no conversion to {account}")


def groupsize_factor(query: str, k: int) -> Fraction:
    """Sensitivity ratio (L1 = L2²) of a group-size query when a person may also form or dissolve a one-person
    household, over the fixed-household relation the plan is calibrated to (see the module docstring)."""
    if query == "counts":
        return Fraction(1)
    if query in ("cumulative", "chain"):
        return Fraction(k)
    raise LedgerRefusal(f"groupsize: no declared conversion for query {query!r}")


def _groupsize_convert(spec: MeasurementSpec, account: str) -> Conversion:
    f = groupsize_factor(str(spec.detail.get("query")), int(spec.detail.get("k", 0)))
    if account == ADD_REMOVE:
        return Conversion(FIXED_HOUSEHOLDS, account, f, f,
                          f"a person forming/dissolving a household: Δ × {f} (L1 = L2²)")
    if account == CHANGE_ONE:
        return Conversion(FIXED_HOUSEHOLDS, account, 4 * f, 2 * f,
                          f"change = remove + add, each up to Δ × {f}: L1 × {2 * f}, L2² × {4 * f}")
    raise LedgerRefusal(f"groupsize: no conversion to {account}")


_DECLARED: dict[str, ProductRelation] = {
    "phsafe": ProductRelation(ADD_REMOVE, _add_remove(GENERIC_CHANGE)),  # household-truncated
    "safetab-p": ProductRelation(ADD_REMOVE, _add_remove(COUNTS_CHANGE)),
    "matrix": ProductRelation(ADD_REMOVE, _add_remove(COUNTS_CHANGE)),  # one marginal per key
    "topdown": ProductRelation(CHANGE_ONE, _topdown_convert,
                               ("total population", "state populations", "block facts (structural zeros)")),
    "groupsize": ProductRelation(FIXED_HOUSEHOLDS, _groupsize_convert, ("number of occupied housing units n",)),
}


def add_remove_product(invariants: tuple[str, ...] = ()) -> ProductRelation:
    """The declaration of a product calibrated under add/remove-one-person (``spec.sensitivity`` is, as for every
    product, Δ₂² (zCDP) / Δ₁ (pure) of each key's whole vector: the ``MeasurementSpec`` convention)."""
    return ProductRelation(ADD_REMOVE, _add_remove(GENERIC_CHANGE), invariants)


def declare(product: str, declaration: ProductRelation) -> None:
    """Declare a (plug-in) product's relation; dasflow's own products are declared above."""
    _DECLARED[product] = declaration


def declared(product: str) -> ProductRelation | None:
    return _DECLARED.get(product)


def require(product: str) -> ProductRelation:
    decl = _DECLARED.get(product)
    if decl is None:
        raise LedgerRefusal(f"product {product!r} declares no neighbouring relation; it cannot spend from an "
                            "account")
    return decl


def convert_specs(specs: list[MeasurementSpec], account_relation: str) -> list[MeasurementSpec]:
    """The plan's keys with their budgets converted to ``account_relation`` (noise unchanged)."""
    import dataclasses

    return [dataclasses.replace(s, budget=require(s.product).convert(s, account_relation).budget(s))
            for s in specs]


def expected_noise(spec: MeasurementSpec, sens: Sensitivity) -> Fraction:
    """noise = f(sensitivity, budget) through the accountant: σ² = Δ₂²/(2ρ) or scale = Δ₁/ε (0 if infinite)."""
    if spec.budget is None or spec.mechanism == "none":
        return Fraction(0)
    norm, value = sens
    if norm == "l2sq":
        return accounting.gaussian_sigma2_sq(spec.budget, value)
    return accounting.geometric_scale(spec.budget, value)


def audit_record(specs: list[MeasurementSpec]) -> dict[str, dict[str, Any]]:
    """Per key what an auditor needs: the product's relation, the whole-vector sensitivity (``l2sq`` = Δ₂² under
    zCDP, ``l1`` = Δ₁ under pure DP) under it, the noise parameter and the budget. The noise is recomputed from
    (sensitivity, budget) through the accountant and a mismatch is refused (``LedgerRefusal``): a plan that
    records any other quantity as its sensitivity (plain L2, a per-count Δ) cannot be frozen.
    ``conversions`` gives the key's budget converted to each account relation, with the argument."""
    out: dict[str, dict[str, Any]] = {}
    for s in specs:
        decl = _DECLARED.get(s.product)
        sens = whole_vector_sensitivity(s)
        noise = expected_noise(s, sens)
        if noise != s.noise:
            raise LedgerRefusal(f"{s.key}: planned noise {s.noise} != {noise} recomputed from sensitivity "
                                f"{sens[0]} = {sens[1]} and budget {s.budget}; refused before any noise")
        out[s.key] = {"relation": decl.relation if decl else "undeclared", f"sensitivity_{sens[0]}": str(sens[1]),
                      "noise": str(s.noise), "budget": _text(s.budget),
                      "conversions": {} if decl is None else {
                          rel: {"budget": _text(c.budget(s)), "argument": c.argument}
                          for rel in RELATIONS for c in [decl.convert(s, rel)]}}
    return out


def _text(budget: Fraction | None) -> str:
    return "Infinity" if budget is None else str(budget)


def invariants(products: Mapping[str, Any] | list[str]) -> dict[str, tuple[str, ...]]:
    """The invariants each product releases exactly."""
    return {p: d.invariants for p in products if (d := _DECLARED.get(p)) is not None}
