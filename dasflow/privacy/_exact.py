"""Exact parsing of budgets and rationals, and the high-precision decimal context of the accountant.

Budgets are ``fractions.Fraction`` end to end (DESIGN §4). Values arrive from JSON configs (the Census
production formats write budgets as JSON numbers, e.g. ``0.534``, or the literal ``Infinity``), so this
module turns them into exact rationals without ever going through a binary float:

* ``load_json_exact`` parses JSON numbers with a fraction part or exponent as :class:`decimal.Decimal`
  (``parse_float=Decimal``), accepts ``Infinity`` and rejects ``NaN``;
* ``parse_budget`` maps such a value to ``Fraction`` (or ``None`` = infinite budget = no noise, variance 0);
* a Python ``float`` is accepted only when its shortest round-trip representation (``repr``) has at most 15
  significant digits (``sys.float_info.dig``): every decimal with ≤ 15 significant digits survives
  decimal → double → decimal unchanged, so such a float is unambiguously the decimal its author wrote, and
  it is converted as ``Fraction(repr(x))`` — never ``Fraction(x)``, which would be the binary value
  (0.1 → 3602879701896397/36028797018963968). A float such as ``0.1 + 0.2`` (repr ``0.30000000000000004``) is
  float-drifted and rejected.

Transcendental quantities ((ε, δ) conversions, MOEs) are evaluated with :data:`HP`, a 50-digit
:class:`decimal.Context` (Python's ``decimal`` computes ``exp``, ``ln`` and ``sqrt`` correctly rounded),
and are returned as ``Decimal``. They are never fed back into a budget; a calibration that must produce a
budget rounds explicitly with :func:`round_rational` to a stated number of decimals and mode.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable
from decimal import (
    MAX_EMAX,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_FLOOR,
    ROUND_HALF_EVEN,
    ROUND_HALF_UP,
    Context,
    Decimal,
    InvalidOperation,
    localcontext,
)
from fractions import Fraction
from typing import Any, Literal, ParamSpec, TypeVar

#: Working precision (significant decimal digits) of every transcendental evaluation in the accountant.
PRECISION = 50
#: The high-precision context. Use its methods (``HP.ln``, ``HP.exp``, ``HP.sqrt``, ``HP.divide`` ...).
HP = Context(prec=PRECISION, Emax=MAX_EMAX, Emin=MIN_EMIN)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def high_precision(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``func`` with :data:`HP` as the current decimal context (so ``+ - * /`` on Decimals use 50
    digits)."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with localcontext(HP):
            return func(*args, **kwargs)

    return wrapper

#: Anything :func:`parse_rational` accepts (validated at run time).
RationalLike = Fraction | int | str | Decimal | float
RoundingMode = Literal["floor", "ceil", "half_up", "half_even"]
_DECIMAL_MODES = {
    "floor": ROUND_FLOOR,
    "ceil": ROUND_CEILING,
    "half_up": ROUND_HALF_UP,
    "half_even": ROUND_HALF_EVEN,
}
_INFINITE_WORDS = frozenset({"infinity", "+infinity", "inf", "+inf"})


def _bad(name: str, value: object, why: str) -> ValueError:
    return ValueError(f"{name}={value!r}: {why}")


def _float_to_fraction(value: float, name: str) -> Fraction:
    text = repr(value)
    mantissa = text.lower().split("e")[0].replace("-", "").replace(".", "").lstrip("0")
    if len(mantissa) > sys.float_info.dig:
        raise _bad(
            name,
            value,
            f"float-drifted value (repr {text} has {len(mantissa)} significant digits > "
            f"{sys.float_info.dig}); give it as an exact decimal string or Fraction",
        )
    return Fraction(text)


def parse_rational(value: object, name: str, *, allow_negative: bool = False) -> Fraction:
    """A finite exact rational from int, Fraction, Decimal, decimal/``p/q`` string or short-repr float.

    Raises ``ValueError`` naming ``name`` and the value for bool, NaN, infinities, float drift, unparsable
    text, other types, and (unless ``allow_negative``) negative values.
    """
    result: Fraction
    if isinstance(value, bool):
        raise _bad(name, value, "a boolean is not a number")
    if isinstance(value, Fraction):
        result = value
    elif isinstance(value, int):
        result = Fraction(value)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise _bad(name, value, "must be a finite number")
        result = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _bad(name, value, "must be a finite number")
        result = _float_to_fraction(value, name)
    elif isinstance(value, str):
        text = value.strip()
        try:
            if "/" in text:
                num, _, den = text.partition("/")
                if not den.strip():
                    raise ValueError(text)
                result = Fraction(int(num.strip()), int(den.strip()))
            else:
                dec = Decimal(text)
                if not dec.is_finite():
                    raise _bad(name, value, "must be a finite number")
                result = Fraction(dec)
        except (InvalidOperation, ValueError, ZeroDivisionError) as exc:
            if isinstance(exc, ValueError) and str(exc).startswith(f"{name}="):
                raise
            raise _bad(name, value, "not an exact decimal or p/q rational") from None
    else:
        raise _bad(name, value, f"unsupported type {type(value).__name__}")
    if result < 0 and not allow_negative:
        raise _bad(name, value, "must be >= 0")
    return result


def is_infinite_literal(value: object) -> bool:
    """True for the JSON ``Infinity`` literal in any of the forms it reaches Python (Decimal, float, str)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, Decimal):
        return value.is_infinite() and value > 0
    if isinstance(value, float):
        return value == math.inf
    if isinstance(value, str):
        return value.strip().lower() in _INFINITE_WORDS
    return False


def parse_budget(value: object, name: str, *, allow_infinite: bool = True) -> Fraction | None:
    """A privacy budget (ρ under zCDP, ε under pure DP) as an exact ``Fraction``; ``None`` = infinite.

    Accepts int, ``Fraction``, ``Decimal`` (as :func:`load_json_exact` produces), decimal or ``p/q``
    strings, the ``Infinity`` literal (``Decimal('Infinity')``, ``float('inf')``, ``"Infinity"``/``"inf"``)
    and floats that round-trip to a short decimal (see the module docstring). An infinite budget means *no
    noise* (variance 0) and an infinite privacy loss; ``allow_infinite=False`` rejects it. Zero is a valid
    budget (the measurement is not made). Anything else — negative, NaN, bool, float drift, ``-Infinity``,
    other types — raises ``ValueError`` naming ``name`` and the value.
    """
    if value is None:
        raise _bad(name, value, "missing budget (use the Infinity literal for an infinite budget)")
    if is_infinite_literal(value):
        if not allow_infinite:
            raise _bad(name, value, "an infinite budget is not allowed here")
        return None
    return parse_rational(value, name)


def parse_positive(value: object, name: str) -> Fraction:
    """A finite rational > 0 (sensitivities, MOE targets, stabilities ...)."""
    result = parse_rational(value, name)
    if result <= 0:
        raise _bad(name, value, "must be > 0")
    return result


def parse_fraction_open(value: object, name: str) -> Fraction:
    """A rational strictly between 0 and 1 (budget fractions such as SafeTab's γ, probabilities)."""
    result = parse_rational(value, name)
    if not 0 < result < 1:
        raise _bad(name, value, "must be strictly between 0 and 1")
    return result


def _parse_constant(token: str) -> Decimal:
    if token == "Infinity":
        return Decimal("Infinity")
    if token == "-Infinity":
        return Decimal("-Infinity")
    raise ValueError(f"JSON constant {token!r} is not allowed (NaN is never a valid number here)")


def load_json_exact(text: str | bytes) -> Any:
    """``json.loads`` keeping numbers exact: fractional/exponent numbers → ``Decimal``, integers → ``int``,
    ``Infinity``/``-Infinity`` → ``Decimal`` infinities (``parse_budget`` rejects the negative one), ``NaN`` →
    ``ValueError``."""
    return json.loads(text, parse_float=Decimal, parse_constant=_parse_constant)


def to_decimal(value: Fraction | int | Decimal) -> Decimal:
    """A rational as a :data:`HP`-precision ``Decimal`` (correctly rounded division)."""
    if isinstance(value, Decimal):
        return value
    frac = Fraction(value)
    return HP.divide(Decimal(frac.numerator), Decimal(frac.denominator))


def round_rational(value: Fraction | Decimal, decimals: int, mode: RoundingMode = "half_up") -> Fraction:
    """Round an exact (or high-precision) value to ``decimals`` decimal places with an explicit ``mode``.

    This is the only way a calibrated value (e.g. a budget computed from an MOE target) becomes a budget: the
    rounding rule is always named by the caller and recorded with the result.
    """
    if mode not in _DECIMAL_MODES:
        raise ValueError(f"mode={mode!r}: must be one of {sorted(_DECIMAL_MODES)}")
    quantum = Decimal(1).scaleb(-decimals)
    if isinstance(value, Fraction):
        # Exact: decide the rounding on the rational itself, not on a truncated decimal expansion.
        scaled = value * Fraction(10) ** decimals
        floor = scaled.numerator // scaled.denominator
        rest = scaled - floor
        if mode == "floor":
            n = floor
        elif mode == "ceil":
            n = floor + (1 if rest else 0)
        elif mode == "half_up":
            n = round_half_up_abs(scaled) if scaled >= 0 else -round_half_up_abs(-scaled)
        else:
            n = round(scaled)
        return Fraction(n) / Fraction(10) ** decimals
    return Fraction(value.quantize(quantum, rounding=_DECIMAL_MODES[mode], context=HP))


def round_half_up_abs(x: Fraction) -> int:
    """Round a non-negative rational to the nearest integer, halves up."""
    floor = x.numerator // x.denominator
    return floor + (1 if x - floor >= Fraction(1, 2) else 0)


def floor_sqrt(value: Fraction) -> int:
    """⌊√value⌋ exactly for a rational value ≥ 0 (⌊√x⌋ = ⌊√⌊x⌋⌋)."""
    if value < 0:
        raise ValueError(f"value={value}: square root of a negative number")
    return math.isqrt(value.numerator // value.denominator)
