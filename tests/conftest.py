"""Shared pytest configuration: every test session gets its own Prefect home and no telemetry."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
if "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="dasflow-prefect-home-")
# the temporary Prefect servers of the commands the tests run seed their fresh databases from one migrated
# template (dasflow.flows.prefect_server), kept for the tests apart from the user's own cache
os.environ.setdefault("DASFLOW_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"dasflow-test-cache-{os.getuid()}"))

# Property-based tests are deterministic in CI: hypothesis derives its examples from the test's name
# (derandomize), so a run either always passes or always fails; no example database is written.
from hypothesis import settings

settings.register_profile("dasflow", derandomize=True, database=None, deadline=None, print_blob=True)
settings.load_profile("dasflow")
