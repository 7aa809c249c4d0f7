"""Test-only fault injection: kill the process at a named point of a release.

Fault-injection tests set ``DASFLOW_FAULT_AT`` to a point name (or a prefix ending in ``*``) and the process
SIGKILLs itself when it reaches the first matching point — the hardest crash there is: no ``finally``, no flush.
It is honoured only together with ``DASFLOW_TEST_MODE=1``, which the tests set; production never sets it.
"""

from __future__ import annotations

import os
import signal


def point(name: str) -> None:
    """A named crash point; a no-op unless a test armed it."""
    target = os.environ.get("DASFLOW_FAULT_AT")
    if not target or os.environ.get("DASFLOW_TEST_MODE") != "1":
        return
    if name == target or (target.endswith("*") and name.startswith(target[:-1])):
        os.kill(os.getpid(), signal.SIGKILL)
