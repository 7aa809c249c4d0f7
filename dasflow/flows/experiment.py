"""The accuracy experiment as a Prefect flow (the Prefect twin of ``dasflow experiment``).

prepare + truth once per product, then N seeded runs per budget scale (``dasflow.experiment.run_experiment``),
then the outputs (``DIR/metrics.csv``, ``DIR/report.html``, the store's ``experiments/{method}/``) and three
artifacts readable in the Prefect UI: the report as Markdown (plots inline), the metrics of the ``all`` bin as a
table, and a link to report.html. An experiment never freezes a release, writes a ledger or spends a budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from dasflow.config import load_release_config
from dasflow.experiment import run_experiment
from dasflow.experiment.metrics import ALL_BIN
from dasflow.experiment.record import write_outputs
from dasflow.experiment.report import experiment_markdown
from dasflow.experiment.scaling import parse_scales, parse_split
from dasflow.io.store import open_store
from dasflow.tasks.stages import _artifact_key


@task(name="experiment-runs", cache_policy=NO_CACHE, persist_result=False)
def experiment_task(config_path: str, runs: int, budget_scales: str, seed: int,
                    products: list[str] | None, out: str, budget_splits: list[str] | None = None) -> dict[str, Any]:
    """All runs of the experiment (one task: the prepared tabulations stay in this process's memory) and its
    files; returns where they are and the metrics of the ``all`` bin (small)."""
    config = load_release_config(config_path)
    exp = run_experiment(config, runs=runs, scales=parse_scales(budget_scales), seed=seed, products=products,
                         splits=[parse_split(t) for t in budget_splits or []], progress=print)
    paths = write_outputs(exp, Path(out), open_store(config.store))
    overall = exp.metrics[exp.metrics["pop_bin"] == ALL_BIN]
    return {"paths": paths, "meta": exp.meta, "markdown": experiment_markdown(exp.metrics, exp.meta, exp.splits),
            "overall": overall.astype(object).where(overall.notna(), None).to_dict("records")}


@flow(name="dasflow-accuracy-experiment", log_prints=True)
def experiment_flow(config_path: str, runs: int = 20, out: str = "experiment", budget_scales: str = "1",
                    seed: int = 0, products: list[str] | None = None,
                    budget_splits: list[str] | None = None) -> dict[str, Any]:
    """Run a release config's products ``runs`` times per budget scale (e.g. "0.5,1,2") and per candidate budget
    split (e.g. ["safetab-p:(USA, 1)=2,(STATE, 1)=1"]) with seeded test noise on its synthetic inputs; metrics of
    the published tables against the truth."""
    result = experiment_task(config_path, runs, budget_scales, seed, products, out, budget_splits)
    key = result["meta"]["release_id"]
    create_markdown_artifact(key=_artifact_key("experiment", key), markdown=result["markdown"],
                             description="accuracy experiment: error of the published tables")
    create_table_artifact(key=_artifact_key("experiment-metrics", key), table=result["overall"],
                          description="metrics over all population sizes, per table, geolevel and budget scale")
    create_link_artifact(key=_artifact_key("experiment-report", key),
                         link=Path(result["paths"]["report.html"]).absolute().as_uri(),
                         description="the experiment's report.html")
    print(f"metrics: {result['paths']['metrics.csv']}; report: {result['paths']['report.html']}")
    return {"paths": result["paths"], "meta": result["meta"]}
