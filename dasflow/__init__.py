"""dasflow: the census disclosure avoidance system as an auditable, resumable production DAG."""

__version__ = "0.1.0"
