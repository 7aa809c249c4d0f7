"""The product plugin: one object per product carrying everything the rest of dasflow asks of a product.

A product package exposes ``PLUGIN``, an instance of a :class:`ProductPlugin` subclass, and one line in
:data:`dasflow.registry.PLUGINS` names its module. Validation, the pipeline, the release stage, the demo, the
budget tools and the CLI iterate over plugins (``dasflow.registry``) and never name a product.

What a plugin carries:

* **config and inputs** — ``load_config`` (the product's exact parser, typed ``C``), ``check_config`` (raw-key
  rules before parsing), ``input_declarations`` (which inputs exist and which are confidential: undeclared inputs
  count as confidential), ``public_inputs`` / ``confidential_inputs`` (read from a release's store);
* **validation** — ``preflight`` (file pre-checks before any reader parses), ``input_checks`` (GX suites,
  vectorised cross-file facts and the product's own fail-closed check), ``output_header`` / ``check_outputs``
  (release-file rules), ``check_release_files`` (the product's production output validator);
* **the neighbouring relation** — ``relation`` (:class:`~dasflow.privacy.relations.ProductRelation`): the
  relation the product's plan is calibrated under, the exact conversion of each key's budget to an account's
  relation, and the invariants it releases exactly. The default ``None`` declares none: such a product runs
  test releases (its keys audited as ``undeclared``) but cannot spend from a privacy-loss account;
* **the privacy-relevant core** — ``product`` (the :class:`~dasflow.products.base.Product`: plan, prepare,
  measure, post-process, tables) and ``partitioned`` (post-processing as independent parts, optional);
* **preprocessing partitions** (optional) — ``partitions`` (independent partitions of the confidential input,
  e.g. states), ``partition_inputs`` (one partition's confidential records) and ``combine_prepared`` (one
  prepared frame of the whole input from its per-partition frames), so the preprocess stage holds one
  partition at a time;
* **release and reports** — ``file_name``, ``invariants`` (certificate), ``extra_release_files`` (derived
  published files), ``truth`` and ``consistency`` (accuracy report), ``zero_filled`` / ``may_be_empty``;
* **accuracy experiments** — ``cell_moes`` (stated per-cell MOEs) and ``scaled_config`` (budget scales of a
  product whose noise comes from its config);
* **synthetic data and the demo** — ``synth_format`` (the synthetic census's writer), ``demo`` (inputs,
  config and public files of the product in ``dasflow demo``) and ``demo_public`` (public files the demo
  derives from the synthetic census for the product);
* **standalone tools** — ``budget_format`` / ``budget_plan`` (``dasflow budget`` on the product's production
  config) and ``cli`` (a subcommand with the Census production file formats).

Privacy: a plugin adds no mechanism of its own; every privacy-relevant number still comes from the product's
``plan`` (checked by the ledger before any noise). ``public_inputs`` must read only public inputs: the
post-processing view (a store that cannot resolve confidential keys) is what the pipeline passes it after
measurement, so a plugin that strays fails closed. ``truth`` reads confidential inputs and is called only for
seeded test releases on synthetic data.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

import numpy as np
import pandas as pd

from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import ObjectStore
from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.privacy.relations import ProductRelation
from dasflow.products.base import Product
from dasflow.products.partition import PartitionedPostprocess

C = TypeVar("C")


class InputDeclaration(NamedTuple):
    """One input a product reads: its name in the release config's ``inputs``, its default prefix, and whether
    it holds confidential data (``dasflow.pipeline.inputs``: undeclared config inputs count as confidential)."""

    name: str
    default: str
    confidential: bool


def config_json(text: str, product: str) -> Any:
    """A product config's JSON with exact decimals (``accounting.load_json_exact``); ``InputError`` if malformed."""
    try:
        return accounting.load_json_exact(text)
    except ValueError as exc:
        raise InputError(f"{product} config is not valid JSON: {exc}", file=f"{product} config") from None


@dataclass(frozen=True)
class DemoEntry:
    """How ``dasflow demo`` runs a product: its inputs (release-config input name -> store prefix: the synthetic
    census is written under ``confidential/synth/``, its public files moved under ``public/``) and its config
    file (a name under ``dasflow/demo_data/``)."""

    inputs: Mapping[str, str]
    config_file: str
    #: public files of the synthetic census to move into the store: path in the synthetic census -> store key
    public_files: Mapping[str, str] = field(default_factory=dict)
    #: store keys :meth:`ProductPlugin.demo_public` writes (the demo regenerates its census if one is missing)
    derived_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class DemoCensus:
    """The demo's freshly generated synthetic census, as :meth:`ProductPlugin.demo_public` sees it: the states
    generated and the synthetic manifest's totals."""

    states: tuple[str, ...]
    totals: Mapping[str, Any]


class BudgetPlan(NamedTuple):
    """A product's budget plan read from its production config alone (``dasflow budget``): one row per key or
    level (product, universe, key, level, definition, budget, and where known sensitivity, noise, variance,
    cells; numbers as exact text, :func:`budget_text`) and, per universe, the (definition, budget) of every
    part to compose into the universe's total."""

    rows: list[dict[str, Any]]
    parts: dict[str, list[tuple[str, Fraction | None]]]


def budget_text(budget: Fraction | None) -> str:
    """An exact budget as text; ``None`` (an infinite budget: no guarantee) as ``Infinity``."""
    return "Infinity" if budget is None else str(budget)


class ProductPlugin(ABC, Generic[C]):
    """Base class of every product plugin (see the module docstring); ``C`` is the product's config type."""

    #: product name in release configs, the registry, release paths and the ledger
    name: ClassVar[str]
    #: human-readable name
    title: ClassVar[str]
    #: every input the product reads (which are confidential is decided here, never by a path prefix)
    input_declarations: ClassVar[tuple[InputDeclaration, ...]]
    #: release files may have no rows (SafeTab-P publishes only what its adaptive thresholds allow)
    may_be_empty: ClassVar[bool] = False
    #: release files list only nonzero cells: an absent cell is published as 0 (accuracy comparisons fill it)
    zero_filled: ClassVar[bool] = False
    #: the synthetic census's writer format for this product's inputs (``dasflow.synth``), if any
    synth_format: ClassVar[str | None] = None
    #: how ``dasflow demo`` runs the product (None: not part of the demo)
    demo: ClassVar[DemoEntry | None] = None
    #: the neighbouring relation the plan is calibrated under and its conversions to an account's relation
    #: (``dasflow.privacy.relations``); None: declares none, so accounts refuse the product's plan
    relation: ClassVar[ProductRelation | None] = None
    #: relative CPU of validating the product's inputs, per person of the census (the national benchmark's
    #: validate CPU-s per person, in µs): releases start validations by it, largest first, so that the longest
    #: do not start last when several run at once. A declared constant, never a property of the inputs (file
    #: sizes would be): the start order recorded by the orchestrator says nothing about the data
    validation_cost: ClassVar[float] = 1.0

    # ------------------------------------------------------------------------------------ config and inputs
    @abstractmethod
    def load_config(self, text: str, universe: str) -> C:
        """The product config (verbatim text) parsed exactly for a release universe; ``InputError`` if bad."""

    def check_config(self, raw: Mapping[str, Any], source: str) -> None:
        """Rules on the raw config keys before the parser runs (unknown keys, where ``Infinity`` may appear)."""

    @abstractmethod
    def product(self, config: C) -> Product[C]:
        """The product object for a loaded config."""

    @abstractmethod
    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: C) -> dict[str, Any]:
        """Public inputs (geography, code lists): may be read by every stage, including post-processing."""

    def derived_public(self, public: Mapping[str, Any], config: C) -> dict[str, bytes]:
        """Objects derived from the public inputs alone that every later process should load instead of
        rebuilding (TopDown: its spine). The plan stage stores them and freezes their SHA-256 with the plan;
        :meth:`load_derived` gets them back verified. Must be deterministic and hold nothing confidential."""
        return {}

    def load_derived(self, public: Mapping[str, Any], derived: Mapping[str, bytes], config: C) -> dict[str, Any]:
        """The public inputs with the stored derived objects (verified against the frozen plan) put to use."""
        return dict(public)

    @abstractmethod
    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: C) -> dict[str, Any]:
        """Confidential inputs: read only by validate, preprocess and measure."""

    @abstractmethod
    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any], config: C) -> dict[str, Any]:
        """The product's own fail-closed input check: raise ``InputError`` naming file, row and column; return a
        summary (counts only, never a confidential value)."""

    @abstractmethod
    def file_name(self, table: str, universe: str) -> str:
        """The release file name of one of the product's tables (as the Census published it)."""

    # ---------------------------------------------------------------------------------------- validation
    def preflight(self, store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
        """Phase-0 checks of the product's input files (delimiters, headers, readable Parquet) before any reader
        parses them; ``InputError`` on the first problem."""

    def input_checks(self, confidential: Mapping[str, Any], public: Mapping[str, Any], config: C) -> InputChecks:
        """The product's input validation plan: GX suites per file, cross-file facts, a summary, and its own
        fail-closed check (default: no suites, the product's ``validate``)."""
        summary: dict[str, Any] = {}

        def own() -> None:
            summary.update(self.validate(confidential, public, config))

        return InputChecks(suites=[], facts=[], summary=summary, own=own)

    def stream_checks(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any], config: C,
                      chunk_rows: int) -> InputChecks:
        """:meth:`input_checks` with the confidential inputs read from the store in chunks (each partition file,
        and at most ``chunk_rows`` rows at a time), keeping only what cross-row rules need: memory follows the
        largest chunk. A plugin that implements it is validated this way by the validate stage (same verdict,
        summary and report as :meth:`input_checks` on the whole input); default: not implemented."""
        raise NotImplementedError(f"{self.name} has no streamed input validation")

    def output_header(self, file: str) -> list[str] | None:
        """The spec header of one release file (relative to ``release/{name}/``); None: generic checks only."""
        return None

    def check_outputs(self, frames: Mapping[str, pd.DataFrame]) -> InputError | None:
        """Cross-file rules on the product's release tables (file -> frame): the first violation, or None."""
        return None

    def check_release_files(self, files: Mapping[str, bytes], config: C) -> None:
        """The product's production output validator on its release files (name -> bytes); raises
        ``DasflowError`` naming the file."""

    # -------------------------------------------------------------------------- preprocessing partitions
    def partitions(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                   config: C) -> list[str] | None:
        """Independent partitions of the confidential input (ids: letters, digits, ``_.-``; e.g. the state
        folders of the input), or None: ``prepare`` runs once on all of :meth:`confidential_inputs` (default).

        A product that returns partitions promises that ``prepare`` on each partition's records
        (:meth:`partition_inputs`), combined name by name with :meth:`combine_prepared`, gives exactly the frames
        ``prepare`` gives on all records: the partitions are disjoint, cover the input, and no transformation
        relates records of two partitions (PHSafe: households never span states). Privacy: partitioning is then
        an implementation of the same function of the data, so every sensitivity in the plan is unchanged."""
        return None

    def partition_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: C,
                         partition: str) -> dict[str, Any]:
        """The confidential inputs of one partition (as :meth:`confidential_inputs` shapes them), reading only
        that partition's files; called by the preprocess stage for each of :meth:`partitions`."""
        raise InputError(f"{self.name} declares no preprocessing partitions")

    def combine_prepared(self, name: str, parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
        """The prepared frame ``name`` of the whole input from its frames per partition (in partition order).

        Default: exact tabulations over a public domain, which are additive across disjoint partitions: every
        part has the same rows (the domain, in the same order) and the sum of their ``COUNT`` columns is the
        whole input's count; any other difference between the parts is an ``IntegrityError``."""
        return sum_counts(name, parts)

    # ------------------------------------------------------------------------------- post-processing parts
    def partitioned(self, product: Product[C]) -> PartitionedPostprocess | None:
        """The product's post-processing as independent parts (None: one ``postprocess`` call)."""
        return None

    # ----------------------------------------------------------------------------------- release, reports
    def invariants(self, public: Mapping[str, Any], config: C) -> list[str]:
        """What the product holds invariant (public statements or public values), for the certificate; ``public``
        comes from :meth:`public_inputs` through the post-processing store view."""
        return [f"{self.name}: not declared by the product (treat as none)"]

    def extra_release_files(self, tables: Mapping[str, pd.DataFrame], config: C) -> dict[str, bytes]:
        """Derived files published beside the tables (path relative to ``release/{name}/`` -> bytes), computed
        from the released tables only (post-processing)."""
        return {}

    def truth(self, store: ObjectStore, inputs: Mapping[str, str], config: C,
              universe: str, public: Mapping[str, Any] | None = None) -> dict[str, pd.DataFrame] | None:
        """The ground-truth twin of the release files (file -> key columns + COUNT), or None if the product has
        none. Reads confidential inputs: called only for seeded test releases on synthetic data. ``public``: the
        product's public inputs as the pipeline loaded them (frozen with the plan, derived objects included)."""
        return None

    def consistency(self, files: Mapping[str, pd.DataFrame], public: Mapping[str, Any],
                    config: C) -> list[dict[str, Any]]:
        """Consistency diagnostics of the released values (rows: check, cells, inconsistent, max_abs_diff)."""
        return []

    # ------------------------------------------------------------------------------- accuracy experiment
    def cell_moes(self, specs: Sequence[MeasurementSpec], published: Mapping[str, pd.DataFrame],
                  public: Mapping[str, Any], universe: str, cache: dict[Any, Any]) -> dict[str, np.ndarray]:
        """The 90 % MOE the plan states for every published row (file -> one value per row), for a product whose
        release files carry no VARIANCE but whose plan determines each cell's MOE (``dasflow experiment``);
        default: none (the experiment uses VARIANCE or the plan level's MOE). Computed from the plan, public
        inputs and the published tables only; ``cache`` persists across the runs of one experiment."""
        return {}

    def scaled_config(self, config: C, factor: Fraction) -> C | None:
        """The config whose budget is ``factor`` × the config's, for a product that draws its noise from its own
        config rather than from the planned keys (``dasflow experiment`` then runs that config's product and
        plan, and refuses budget splits); default None: noise comes from the planned keys, so the experiment
        scales the plan itself."""
        return None

    # ---------------------------------------------------------------------------------------- the demo
    def demo_public(self, store: ObjectStore, census: DemoCensus) -> None:
        """Write the product's demo public files derived from the synthetic census (the keys in
        ``demo.derived_files``); called once, after the census is generated. Only public facts may be written:
        geography, or counts the DAS holds invariant and publishes (the product's ``invariants`` declare them)."""

    # --------------------------------------------------------------------------------- standalone tools
    def budget_format(self, raw: Mapping[str, Any] | None) -> bool:
        """Whether a config is this product's production config (``dasflow budget --format auto``): ``raw`` is
        the file's JSON object, or None when the config given is a directory."""
        return False

    def budget_plan(self, path: Path) -> BudgetPlan:
        """The budget plan of the product's production config at ``path`` without reading any data (a product
        whose ``budget_format`` can be true overrides this)."""
        raise InputError(f"{self.name} has no standalone budget format", file=str(path))

    def cli(self) -> CliCommand | None:
        """A standalone subcommand with the Census production file formats (None: none)."""
        return None


def sum_counts(name: str, parts: Sequence[pd.DataFrame], count: str = "COUNT") -> pd.DataFrame:
    """Per-partition tabulations of one prepared frame summed into the whole input's (see
    :meth:`ProductPlugin.combine_prepared`): the parts' domain columns must be identical, row for row; the
    result is the first part with ``count`` replaced by the exact int64 sum."""
    if not parts:
        raise IntegrityError(f"prepared {name!r}: no partition holds it")
    first = parts[0]
    keys = [c for c in first.columns if c != count]
    total = first[count].to_numpy(np.int64).copy()
    for i, part in enumerate(parts[1:], start=1):
        if list(part.columns) != list(first.columns) or len(part) != len(first) \
                or not part[keys].reset_index(drop=True).equals(first[keys].reset_index(drop=True)):
            raise IntegrityError(f"prepared {name!r}: partition {i} does not have the domain of partition 0")
        total += part[count].to_numpy(np.int64)
    out = first.reset_index(drop=True).copy()
    out[count] = total
    return out


def overrides(plugin: ProductPlugin[Any], hook: str) -> bool:
    """Whether a plugin implements an optional hook itself (callers skip the inputs a default would ignore)."""
    return getattr(type(plugin), hook) is not getattr(ProductPlugin, hook)


class InputChecks(NamedTuple):
    """A product's input validation plan (see :meth:`ProductPlugin.input_checks`): ``suites`` are
    ``dasflow.validation.products.InputSuite`` (one GX suite per input file), ``facts`` cross-file rule outcomes
    (``dasflow.validation.products.fact``), ``summary`` the counts reported, ``own`` the product's own check (raises the
    authoritative ``InputError``)."""

    suites: list[Any]
    facts: list[dict[str, object]]
    summary: dict[str, Any]
    own: Callable[[], None] | None


@dataclass(frozen=True)
class CliCommand:
    """A product's standalone subcommand: ``add`` builds its argument parser, ``run`` executes it (exit code)."""

    name: str
    help: str
    add: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
