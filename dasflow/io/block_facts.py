"""The columns of a ``block_facts.csv`` file (TopDown's public structural-zero facts), shared by the synthetic
census that writes it (``dasflow.synth.writers``) and the TopDown product that reads it
(``dasflow.products.topdown.invariants``, which documents the format). A file format, so it sits on the
bottom layer both can import."""

from __future__ import annotations


def fact_columns(n_codes: int) -> tuple[str, ...]:
    """``HU`` then ``GQ1`` … ``GQ{n_codes − 1}``: column k holds the count behind code k."""
    return ("HU", *(f"GQ{t}" for t in range(1, n_codes)))
