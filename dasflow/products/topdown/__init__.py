"""TopDown (PL 94-171 / DHC) on an optimised geographic spine: spine, strategy, measurement, estimation.

See docs/topdown.md. Entry points: :class:`~dasflow.products.topdown.product.TopDown` (the Product interface),
:func:`~dasflow.products.topdown.spine.build_spine`, :func:`~dasflow.products.topdown.spine.preset`,
:func:`~dasflow.products.topdown.strategy.make_strategy`, and for the DAG
:func:`~dasflow.products.topdown.batch.estimate_families` (one level's parents, independent tasks) with
:class:`~dasflow.products.topdown.model.Constraints` (state totals, structural zeros) built by
``TopDown.constraints`` from the public inputs of :mod:`~dasflow.products.topdown.invariants`.
"""
