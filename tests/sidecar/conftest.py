"""The sidecar tests' helpers live in tests/helpers/sidecar.py and their fixture in tests/conftest.py.

These names stay importable from here for the test modules of branches written before the move (issue 23);
once every branch is merged, point their imports at tests.helpers.sidecar and delete this file.
"""

from tests.helpers.sidecar import REPO, SidecarProc, parse_metrics, sample, total, wait_until

__all__ = ["REPO", "SidecarProc", "parse_metrics", "sample", "total", "wait_until"]
