"""Benchmark of input validation (issue 11 item 4): 10 M persons validated in < 60 s on this machine.

Each measurement runs in a fresh subprocess (its own peak RSS, its own GX import). Reported side by side:

* ``dasflow`` : what the release DAG's validate gate does for one product — phase-0 preflight of every file,
  the product's own reader (phases 1–2), then ``validation.run_product_suite`` (the product's cross-file
  checks, the vectorised per-state facts, the GX suites on distinct-value domains, the Data Docs page);
* ``peer``    : the field-notes pattern (prefect-gx-s3-field-notes.md §3): the same PHSafe persons
  expectations validated by GX row by row on the full frame (one batch, SUMMARY), on the same rows
  (``--peer-persons``, default all), against the same suite on the distinct-value domain (like for like).

Data: the synthetic census (``dasflow.synth``, Census text formats), generated once into ``--data`` and reused.
Usage::

    .venv/bin/python benchmarks/validation.py                         # 10 M persons, peer at 10 M too
    .venv/bin/python benchmarks/validation.py --persons 1e6 --peer-persons 2e5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# run as a script, this file's folder is sys.path[0] and its name would shadow the ``validation`` package
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(ROOT)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(out: dict[str, Any], name: str, fn: Any) -> Any:
    t, c = time.perf_counter(), _cpu()
    value = fn()
    out[name] = {"wall_s": round(time.perf_counter() - t, 2), "cpu_s": round(_cpu() - c, 2)}
    return value


def _head(src: Path, dst: Path, rows: int | None) -> Path:
    """The first ``rows`` data lines of a file (the whole file if None)."""
    if rows is None:
        return src
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fi, dst.open("wb") as fo:
        for i, line in enumerate(fi):
            if i > rows:
                break
            fo.write(line)
    return dst


def run_dasflow(product: str, data: Path) -> dict[str, Any]:
    from importlib import resources

    from dasflow.io.store import LocalStore
    from dasflow.registry import get_plugin
    from dasflow.validation import gx
    from dasflow.validation.configs import validate_product_config
    from dasflow.validation.products import run_product_suite

    out: dict[str, Any] = {"product": product}
    _timed(out, "gx_import", gx._context)
    store = LocalStore(data)
    inputs = {"phsafe": "phsafe/", "phsafe_geo": "phsafe/", "safetab-p": "safetab_p/",
              "safetab-p_public": "safetab_p/"}
    plugin = get_plugin(product)
    name = {"phsafe": "phsafe-us-config.json", "safetab-p": "safetab-p-config.json"}[product]
    text = resources.files("dasflow.demo_data").joinpath(name).read_text(encoding="utf-8")
    cfg = validate_product_config(plugin, text, "US")

    def preflight() -> None:
        plugin.preflight(store, inputs, public=True)
        plugin.preflight(store, inputs, public=False)

    _timed(out, "phase0_preflight", preflight)
    public = _timed(out, "phase1_2_public_read", lambda: plugin.public_inputs(store, inputs, cfg))
    conf = _timed(out, "phase1_2_confidential_read", lambda: plugin.confidential_inputs(store, inputs, cfg))
    result = _timed(out, "phase3_and_gx_suites", lambda: run_product_suite(plugin, conf, public, cfg))
    assert result.success, result.error
    out["persons"] = (len(conf["persons"]["MAFID"]) if product == "phsafe" else int(conf["persons"].num_rows))
    out["expectations"] = result.summary["expectations"]
    out["states"] = len(result.summary.get("persons_per_state", {}))
    out["validate_total_s"] = round(sum(out[k]["wall_s"] for k in out if k.startswith("phase")), 2)
    out["validate_total_cpu_s"] = round(sum(out[k]["cpu_s"] for k in out if k.startswith("phase")), 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def run_peer(data: Path) -> dict[str, Any]:
    """Row-level GX on the full PHSafe persons frame with the same expectations as the dasflow suite."""
    import pandas as pd

    from dasflow.products.phsafe.checks import SUITES
    from dasflow.products.phsafe.inputs import read_table
    from dasflow.validation import gx

    out: dict[str, Any] = {"product": "phsafe persons, row-level GX"}
    _timed(out, "gx_import", gx._context)
    cols = _timed(out, "read", lambda: read_table(data / "phsafe" / "persons.csv", "persons"))
    frame = pd.DataFrame(cols)
    res = _timed(out, "gx_row_level", lambda: gx.validate("peer.persons", SUITES["persons"], frame))
    assert res.success
    out["persons"] = len(frame)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def run_dasflow_persons_suite(data: Path) -> dict[str, Any]:
    """The like-for-like counterpart of the peer: the same persons suite on the distinct-value domain."""
    from dasflow.products.phsafe.checks import SUITES
    from dasflow.products.phsafe.inputs import read_table
    from dasflow.validation import gx
    from dasflow.validation.domain import domain_frame
    from dasflow.validation.products import range_only

    out: dict[str, Any] = {"product": "phsafe persons, domain GX"}
    _timed(out, "gx_import", gx._context)
    cols = _timed(out, "read", lambda: read_table(data / "phsafe" / "persons.csv", "persons"))
    res = _timed(out, "gx_domain", lambda: gx.validate("dom.persons", SUITES["persons"], domain_frame(
        cols, extremes_only=range_only(SUITES["persons"]))))
    assert res.success
    out["persons"] = len(cols["MAFID"])
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def _sub(kind: str, product: str, data: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--product", product, "--data", str(data)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GX_ANALYTICS_ENABLED": "False"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} {product} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ensure_data(path: Path, persons: int, seed: int = 11) -> None:
    if (path / "manifest.json").exists():
        return
    from dasflow import synth

    t = time.perf_counter()
    us = [s for s in synth.parse_states(None) if s != "72"]
    synth.generate(path, persons=persons, seed=seed, states=us, formats=("phsafe", "safetab_p"))
    print(f"generated {persons:,} persons into {path} in {time.perf_counter() - t:.0f} s", flush=True)


def subset(full: Path, target: Path, rows: int) -> Path:
    """A prefix of the persons files (units/geo/GRF-C kept whole: the cross-file rules still hold)."""
    if (target / "done").exists():
        return target
    import shutil

    for sub, names in (("phsafe", ("persons.csv", "units.csv", "geo.csv")),
                       ("safetab_p", ("person-records.txt", "GRF-C.txt"))):
        for name in names:
            src = full / sub / name
            if name in ("persons.csv", "person-records.txt"):
                _head(src, target / sub / name, rows)
            else:
                (target / sub).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target / sub / name)
    (target / "done").write_text("ok\n")
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", type=float, default=10e6)
    ap.add_argument("--peer-persons", type=float, default=10e6)
    ap.add_argument("--data", default="/tmp/dasflow-bench-validation")
    ap.add_argument("--child", default=None)
    ap.add_argument("--product", default="phsafe")
    ap.add_argument("--out", default=None, help="write the JSON results here")
    args = ap.parse_args()
    if args.child:
        data = Path(args.data)
        if args.child == "dasflow":
            print(json.dumps(run_dasflow(args.product, data)))
        elif args.child == "peer":
            print(json.dumps(run_peer(data)))
        else:
            print(json.dumps(run_dasflow_persons_suite(data)))
        return
    persons, peer = int(args.persons), int(args.peer_persons)
    full = Path(args.data) / f"{persons}"
    ensure_data(full, persons)
    small = full if peer >= persons else subset(full, Path(args.data) / f"{persons}-head{peer}", peer)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": f"{os.cpu_count()} cores, "
        f"{platform.machine()}, Python {platform.python_version()}", "command": " ".join(sys.argv)}
    for product in ("phsafe", "safetab-p"):
        results[f"{product}@{persons}"] = r = _sub("dasflow", product, full)
        print(json.dumps(r), flush=True)
    results[f"peer@{peer}"] = _sub("peer", "phsafe", small)
    results[f"domain@{peer}"] = _sub("domain", "phsafe", small)
    print(json.dumps(results[f"peer@{peer}"]), json.dumps(results[f"domain@{peer}"]), flush=True)
    ratio = results[f"peer@{peer}"]["gx_row_level"]["wall_s"] / max(results[f"domain@{peer}"]["gx_domain"]["wall_s"],
                                                                    1e-3)
    results["peer_over_dasflow_gx_time"] = round(ratio, 1)
    for product in ("phsafe", "safetab-p"):
        r = results[f"{product}@{persons}"]
        print(f"{product}: {r['persons']:,} persons validated in {r['validate_total_s']} s wall "
              f"({r['validate_total_cpu_s']} s CPU; GX import {r['gx_import']['wall_s']} s once per process), "
              f"peak RSS {r['peak_rss_mb']} MB, target < 60 s: {'met' if r['validate_total_s'] < 60 else 'MISSED'}")
    print(f"row-level GX (peer) / domain GX (dasflow) on {peer:,} persons: {ratio:.1f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
