"""The ``flow.serve`` equivalent of ``prefect.yaml`` (one long-running process, no work pool):

    .venv/bin/python deployments/serve.py            # against PREFECT_API_URL
"""

from __future__ import annotations

from prefect import serve

from flows.operator import ledger_report_flow, publish_flow, rerun_postprocess_flow, resume_flow
from flows.release import release_from_file


def deployments() -> list[object]:
    """The deployments of ``prefect.yaml`` as served deployments (same names, schedule, parameters)."""
    return [
        release_from_file.to_deployment(name="scheduled-release", cron="0 2 * * *",
                                        parameters={"request": {"config_path": "configs/release-us.json"}},
                                        tags=["dasflow", "release"]),
        resume_flow.to_deployment(name="resume-release", tags=["dasflow", "operator"]),
        rerun_postprocess_flow.to_deployment(name="rerun-postprocess", tags=["dasflow", "operator"]),
        ledger_report_flow.to_deployment(name="ledger-report", tags=["dasflow", "operator"]),
        publish_flow.to_deployment(name="publish", tags=["dasflow", "operator"]),
    ]


if __name__ == "__main__":
    serve(*deployments())  # type: ignore[arg-type]
