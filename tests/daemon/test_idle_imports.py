"""An idle sidecar holds no module it does not need yet (issue 28: every MiB of the idle baseline is in the soak's peak).

scipy (``scipy.special`` 26 MiB, ``scipy.stats`` 46 MiB more, measured by bench/idle_rss.py) is imported by the
functions that compute with it, not when the drift, canary, tail or GPU component is built; start-up still checks
that it is installed, so a missing one is named when the sidecar starts, as before.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar, StartupError
from tests.helpers.net import free_port
from tests.helpers.sidecar import MODULES_LAUNCHER, wait_until

#: Packages a default sidecar with no traffic must not import.
HEAVY = ("scipy", "pandas", "evidently", "sklearn", "pyarrow", "torch")
#: The modules that imported scipy at start-up before (so this test sees the code it guards loaded).
FORMER_IMPORTERS = ("inferwatch_sidecar.components.canary.judge", "inferwatch_sidecar.components.drift.multivariate",
                    "inferwatch_sidecar.stats.hypothesis", "inferwatch_sidecar.stats.compare",
                    "inferwatch_sidecar.stats.quantiles")


def test_a_started_idle_sidecar_has_not_imported_scipy(sidecar_factory: Any, tmp_path: Path) -> None:
    mods = tmp_path / "modules.txt"
    sc = sidecar_factory("--udp-port", str(free_port(socket.SOCK_DGRAM)), env={"IW_MODULES": str(mods)},
                         defaults=("--no-gpu",), launcher=MODULES_LAUNCHER, ready_timeout=60)
    status, _, _ = sc.get("/metrics")  # scraped, as an idle sidecar in a pod is
    assert status == 200
    status, _, body = sc.get("/v1/status")
    assert status == 200
    assert b'"drift"' in body and b'"canary"' in body
    os.kill(sc.pid, signal.SIGUSR2)
    wait_until(mods.exists, timeout=10, what="the module list")
    loaded = set(mods.read_text().split())
    missing = [m for m in FORMER_IMPORTERS if m not in loaded]
    assert not missing, f"the components this test guards were not built: {missing}"
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"an idle default sidecar imported {heavy[:10]} ({len(heavy)} modules)"


def test_the_lazy_statistics_still_compute() -> None:
    from inferwatch_sidecar.components.canary.judge import exact_greater
    from inferwatch_sidecar.stats import hypothesis, quantiles

    assert quantiles.norm_ppf(0.975) == pytest.approx(1.959963984540054, rel=1e-15)
    assert exact_greater(1, 1000, 30, 1000) < 1e-6
    assert hypothesis.ks_pvalue(0.5, 100, 100) < 1e-9
    assert hypothesis.chi2_homogeneity(np.array([10.0, 90.0]), np.array([50.0, 50.0]))[1] < 1e-6


@pytest.mark.parametrize("component", ["drift", "canary"])
def test_a_missing_scipy_is_named_at_start_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              component: str) -> None:
    monkeypatch.setitem(sys.modules, "scipy", None)  # importlib.util.find_spec("scipy") -> None: not installed
    others = {"drift", "canary", "tail"} - {component}
    tree: dict[str, Any] = {"ingest": {"socket": str(tmp_path / "s.sock")}, "http": {"port": 0},
                            "gpu": {"enabled": False}, **{c: {"enabled": False} for c in others}}
    with pytest.raises(StartupError, match=rf"^{component}: cannot import .*No module named 'scipy'.*inferwatch\[sidecar\]"):
        Sidecar(load_config(environ={}, overrides=tree), environ={}).check()
