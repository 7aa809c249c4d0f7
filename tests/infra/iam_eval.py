"""A small, exact evaluator of IAM policy documents for one request (moto has no ``simulate_principal_policy``).

Implements the part of the AWS evaluation logic the dasflow templates use, and refuses (``ValueError``) anything
else rather than guess: Effect Allow/Deny; Action/NotAction (case-insensitive, ``*`` and ``?`` wildcards);
Resource/NotResource (case-sensitive wildcards; policy variables refused); Condition operators StringEquals,
StringNotEquals, StringLike, StringNotLike, ArnEquals, ArnLike, ArnNotEquals, ArnNotLike, Bool (values within
one key OR-ed, keys and operators AND-ed; a negated operator on a missing key matches, a positive one does not)
and Null ("true": the key is absent from the request; "false": present);
resource-policy Principal only ``"*"`` or ``{"AWS": "*"}``. Decision: an explicit Deny in any policy wins, else an
Allow in any policy (same account), else implicit deny.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

Decision = Literal["allow", "explicit-deny", "implicit-deny"]
_OPERATORS = {"StringEquals", "StringNotEquals", "StringLike", "StringNotLike", "ArnEquals", "ArnLike",
              "ArnNotEquals", "ArnNotLike", "Bool", "Null"}


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def wildcard_match(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    """IAM wildcard match: ``*`` any run of characters (including ``/``), ``?`` exactly one character."""
    if "${" in pattern:
        raise ValueError(f"policy variables are not supported: {pattern!r}")
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def _condition_holds(condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    for operator, tests in condition.items():
        if operator not in _OPERATORS:
            raise ValueError(f"unsupported condition operator {operator!r}")
        for key, expected in tests.items():
            values = _as_list(expected)
            actual = context.get(key)
            if operator == "Null":
                if (actual is None) != (values[0].lower() == "true"):
                    return False
                continue
            negated = "Not" in operator
            if actual is None:
                if not negated:
                    return False
                continue
            if operator == "Bool":
                hit = any(v.lower() == actual.lower() for v in values)
            elif operator.endswith("Like"):
                hit = any(wildcard_match(v, actual) for v in values)
            else:
                hit = actual in values
            if hit == negated:
                return False
    return True


def statement_applies(statement: Mapping[str, Any], action: str, resource: str,
                      context: Mapping[str, str]) -> bool:
    """Whether one statement matches the request (its Effect is not looked at)."""
    unknown = set(statement) - {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition",
                                "Principal"}
    if unknown:
        raise ValueError(f"unsupported statement elements {sorted(unknown)}")
    if "Principal" in statement and statement["Principal"] not in ("*", {"AWS": "*"}):
        raise ValueError(f"unsupported Principal {statement['Principal']!r}")
    if "Action" in statement:
        if not any(wildcard_match(p, action, case_sensitive=False) for p in _as_list(statement["Action"])):
            return False
    elif any(wildcard_match(p, action, case_sensitive=False) for p in _as_list(statement["NotAction"])):
        return False
    if "Resource" in statement:
        if not any(wildcard_match(p, resource) for p in _as_list(statement["Resource"])):
            return False
    elif any(wildcard_match(p, resource) for p in _as_list(statement["NotResource"])):
        return False
    return _condition_holds(statement.get("Condition", {}), context)


def evaluate(documents: Iterable[Mapping[str, Any]], action: str, resource: str,
             context: Mapping[str, str] | None = None) -> Decision:
    """The decision of the given policy documents (identity and resource policies together) on one request."""
    allowed = False
    for doc in documents:
        statements = doc["Statement"]
        for statement in [statements] if isinstance(statements, dict) else statements:
            if statement["Effect"] not in ("Allow", "Deny"):
                raise ValueError(f"bad Effect {statement['Effect']!r}")
            if statement_applies(statement, action, resource, context or {}):
                if statement["Effect"] == "Deny":
                    return "explicit-deny"
                allowed = True
    return "allow" if allowed else "implicit-deny"
