"""Neighbouring relations: the generic machinery that converts a product's budget to an account's relation.

A privacy-loss account (``dasflow.privacy.account``) composes budgets under **one** neighbouring relation:

``add_remove_person``   (default) the dataset with one person added or removed, household membership free: the
                        person may join or leave an existing household, or form / dissolve a one-person one.
``change_one_person``   one person's record replaced by any other record (the number of persons fixed).

Each product declares, on its plugin (``ProductPlugin.relation``, a :class:`ProductRelation`), the relation its
plan was calibrated under and how its keys' sensitivities change under the account's relation; the declaration
and its argument live in the product's package. For one key with sensitivity Δ under the product's relation and
Δ' under the account's, noise calibrated to Δ at budget b is a mechanism of budget b·(Δ'/Δ)² (zCDP:
ρ = Δ²/(2σ²)) or b·(Δ'/Δ) (pure DP: ε = Δ₁/scale) under the account's relation. A declaration's factors are
those ratios (squared-L2 ratio for ρ, L1 ratio for ε), checked per product by neighbour enumeration in
``tests/privacy_accounting/test_relations.py``; docs/accounts.md has the short proofs.

The conversions shared by products calibrated under add/remove one person are here: → change-one-person, a change
is a removal then an addition, so Δ' ≤ 2Δ in every norm (triangle inequality): ρ × 4, ε × 2
(:data:`GENERIC_CHANGE`, sound for every query); for keys to which a person adds 0 or 1 per entry (counts,
marginal cells) a change clears ≤ Δ₁ entries and raises ≤ Δ₁ others by 1, so L1 = L2² at most doubles: ρ × 2,
ε × 2 (:data:`COUNTS_CHANGE`).

A product is looked up by name through ``dasflow.registry`` (the bottom layer: privacy imports no product); a
product whose plugin declares no relation (or an unknown name) cannot spend from an account (``LedgerRefusal``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from dasflow import registry
from dasflow.errors import InputError, LedgerRefusal
from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec

Relation = Literal["add_remove_person", "change_one_person"]
RELATIONS: tuple[str, ...] = ("add_remove_person", "change_one_person")
ADD_REMOVE: Relation = "add_remove_person"
CHANGE_ONE: Relation = "change_one_person"

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


def add_remove_conversion(change: tuple[Fraction, Fraction, str]) -> Callable[[MeasurementSpec, str], Conversion]:
    """The conversion of a product calibrated under add/remove one person: identity to add/remove, ``change``
    (ρ factor, ε factor, argument) to change-one-person."""
    def convert(spec: MeasurementSpec, account: str) -> Conversion:
        if account == ADD_REMOVE:
            return Conversion(ADD_REMOVE, account, Fraction(1), Fraction(1), "same relation")
        if account == CHANGE_ONE:
            return Conversion(ADD_REMOVE, account, change[0], change[1], change[2])
        raise LedgerRefusal(f"{spec.product}: no conversion from {ADD_REMOVE} to {account}")
    return convert


def add_remove_product(invariants: tuple[str, ...] = (),
                       change: tuple[Fraction, Fraction, str] = GENERIC_CHANGE) -> ProductRelation:
    """The declaration of a product calibrated under add/remove-one-person (``spec.sensitivity`` is, as for every
    product, Δ₂² (zCDP) / Δ₁ (pure) of each key's whole vector: the ``MeasurementSpec`` convention); ``change``
    is its conversion to change-one-person (:data:`GENERIC_CHANGE` is sound for every query)."""
    return ProductRelation(ADD_REMOVE, add_remove_conversion(change), invariants)


def declared(product: str) -> ProductRelation | None:
    """The relation a product's plugin declares (``ProductPlugin.relation``); None for a plugin that declares
    none or a product the registry does not know."""
    try:
        plugin = registry.get_plugin(product)
    except InputError:
        return None
    return plugin.relation


def require(product: str) -> ProductRelation:
    """The product's declared relation; ``LedgerRefusal`` if it declares none (it cannot spend from an account)."""
    decl = declared(product)
    if decl is None:
        raise LedgerRefusal(f"product {product!r} declares no neighbouring relation; it cannot spend from an "
                            "account")
    return decl


def _lookup(specs: list[MeasurementSpec]) -> dict[str, ProductRelation | None]:
    """Each product of the plan's declared relation (looked up once per product)."""
    return {p: declared(p) for p in dict.fromkeys(s.product for s in specs)}


def convert_specs(specs: list[MeasurementSpec], account_relation: str) -> list[MeasurementSpec]:
    """The plan's keys with their budgets converted to ``account_relation`` (noise unchanged); ``LedgerRefusal``
    for a product that declares no relation."""
    decls = {p: require(p) for p in dict.fromkeys(s.product for s in specs)}
    return [dataclasses.replace(s, budget=decls[s.product].convert(s, account_relation).budget(s)) for s in specs]


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
    decls = _lookup(specs)
    for s in specs:
        decl = decls[s.product]
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
    return {p: d.invariants for p in products if (d := declared(p)) is not None}
