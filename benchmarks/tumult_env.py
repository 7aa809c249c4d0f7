"""A separate virtualenv with Tumult Analytics 0.21, the peer that dasflow benchmarks compare against.

Tumult Analytics pins pandas < 2, numpy < 2 and PySpark < 3.6 on Python 3.11, so it cannot live in the dasflow
environment. This module creates (idempotently) ``.bench/tumult-venv`` (gitignored) and runs Python code
in it.

API (kept deliberately small; SafeTab-P's benchmark reuses it)::

    from benchmarks import tumult_env
    tumult_env.ensure()                          # create/install once; no-op when already installed
    timings = tumult_env.run_script(code, {"persons": "/tmp/p.parquet"}, timeout=3600)
    # `code` is Python source run by the venv interpreter. It receives the dict as JSON in the environment
    # variable TUMULT_ARGS (read it with tumult_env_args()) and must print ONE JSON object as the LAST line of
    # stdout; run_script returns that object (plus "wall_s" and "peak_rss_mb" of the child process tree).
    # The prelude also defines tumult_spark(driver_memory="3g", cores=2): a local SparkSession for Java 17.

Command line: ``python benchmarks/tumult_env.py install`` (same as ensure()), ``... check`` (prints versions).
Java 17 must be on PATH (PySpark 3.5 runs on it); the helper sets the JVM flags Spark 3.5 needs on Java 17.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".bench" / "tumult-venv"
PYTHON = VENV / "bin" / "python"
MARKER = VENV / ".dasflow-installed"
REQUIREMENTS = ["tmlt.analytics==0.21.0"]
BASE_PYTHON = "/usr/bin/python3.11"

#: Spark 3.5 on Java 17 needs these module openings; local mode, quiet logs.
JAVA_OPTS = " ".join(
    f"--add-opens=java.base/{p}=ALL-UNNAMED"
    for p in ("java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
              "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch",
              "sun.nio.cs", "sun.security.action", "sun.util.calendar")
)

#: Prelude prepended to every script: reads the arguments, builds a local SparkSession with bounded memory.
PRELUDE = '''
import json as _json, os as _os
def tumult_env_args():
    return _json.loads(_os.environ.get("TUMULT_ARGS", "{}"))
def tumult_spark(driver_memory="3g", cores=2):
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master(f"local[{cores}]")
            .config("spark.driver.memory", driver_memory)
            .config("spark.sql.shuffle.partitions", str(4 * cores))
            .config("spark.ui.enabled", "false")
            .config("spark.driver.extraJavaOptions", _os.environ.get("TUMULT_JAVA_OPTS", ""))
            .getOrCreate())
'''


def installed() -> bool:
    """Whether the venv exists and finished installing."""
    return MARKER.exists() and PYTHON.exists()


def ensure(quiet: bool = False) -> Path:
    """Create the venv and install Tumult Analytics 0.21 with its pinned dependencies (idempotent)."""
    if installed():
        return PYTHON
    VENV.parent.mkdir(parents=True, exist_ok=True)
    if not PYTHON.exists():
        subprocess.run([BASE_PYTHON, "-m", "venv", str(VENV)], check=True)
    out = subprocess.DEVNULL if quiet else None
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "--upgrade", "pip", "wheel"], check=True,
                   stdout=out)
    subprocess.run([str(PYTHON), "-m", "pip", "install", *REQUIREMENTS], check=True, stdout=out)
    subprocess.run([str(PYTHON), "-c", "import tmlt.analytics, pyspark"], check=True)
    MARKER.write_text(versions_json())
    return PYTHON


def versions_json() -> str:
    """The versions of Tumult, PySpark, pandas, numpy in the venv, as JSON text."""
    code = ("import json, importlib.metadata as m; print(json.dumps({p: m.version(p) for p in "
            "['tmlt.analytics', 'tmlt.core', 'pyspark', 'pandas', 'numpy']}))")
    proc = subprocess.run([str(PYTHON), "-c", code], check=True, capture_output=True, text=True)
    return proc.stdout.strip()


def _env(args: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env["TUMULT_ARGS"] = json.dumps(args)
    env["TUMULT_JAVA_OPTS"] = JAVA_OPTS
    env["PYSPARK_PYTHON"] = str(PYTHON)
    env["PYSPARK_DRIVER_PYTHON"] = str(PYTHON)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _tree_rss(proc: psutil.Process, cpu: dict[int, float]) -> int:
    """Summed RSS of the process tree; records each process's latest user + system CPU seconds in ``cpu``."""
    total = 0
    procs = [proc]
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        procs += proc.children(recursive=True)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
            t = p.cpu_times()
            cpu[p.pid] = t.user + t.system
    return total


def _watch(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str, float, int, float]:
    """Run ``cmd``; return (returncode, stdout, stderr, wall s, peak process-tree RSS bytes, CPU s).

    CPU is user + system time: the larger of the ``RUSAGE_CHILDREN`` delta (the child and the descendants it
    reaped) and the sum over every process of the tree as last sampled (covers an un-reaped Spark JVM).
    """
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        peak = 0
        sampled: dict[int, float] = {}
        with subprocess.Popen(cmd, env=env, stdout=out_f, stderr=err_f, text=True) as proc:
            ps = psutil.Process(proc.pid)
            while proc.poll() is None:
                peak = max(peak, _tree_rss(ps, sampled))
                if time.perf_counter() - t0 > timeout:
                    proc.kill()
                    proc.wait()
                    raise RuntimeError(f"tumult script timed out after {timeout} s")
                time.sleep(0.2)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = max((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), sum(sampled.values()))
        out_f.seek(0)
        err_f.seek(0)
        return proc.returncode, out_f.read(), err_f.read(), wall, peak, cpu


def run_script(code: str, args: dict[str, Any] | None = None, timeout: float = 3600.0) -> dict[str, Any]:
    """Run ``code`` in the Tumult venv; return the JSON object it prints last, plus wall time and peak RSS.

    ``peak_rss_mb`` is the peak of the summed resident set size of the child process tree (the Python driver
    and the Spark JVM it launches), sampled every 0.2 s; ``cpu_s`` its user + system CPU time.
    """
    ensure(quiet=True)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(PRELUDE + "\n" + code)
        path = fh.name
    try:
        rc, stdout, stderr, wall, peak, cpu = _watch([str(PYTHON), path], _env(args or {}), timeout)
    finally:
        os.unlink(path)
    if rc != 0:
        raise RuntimeError(f"tumult script failed ({rc}):\n{stderr[-4000:]}")
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError(f"tumult script printed nothing:\n{stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = wall
    result["peak_rss_mb"] = peak / 2**20
    result["cpu_s"] = cpu
    return result


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else "install"
    if cmd == "install":
        ensure()
        print(versions_json())
        return 0
    if cmd == "check":
        print(versions_json() if installed() else "not installed")
        return 0 if installed() else 1
    print(f"usage: {argv[0]} install|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
