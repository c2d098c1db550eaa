"""Run Prometheus for the demo: on loopback, scraping the sidecar every second, with our rules.

The rules come from ``alerts/generate.py --fast`` (the same alerts as
production with windows and ``for:`` durations divided by 60), which lives in
a source checkout of inferwatch. Without it Prometheus still runs and shows
the metrics, with no alerts. With ``alertmanagers`` it sends its alerts there
(:mod:`.alertmanager`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from inferwatch_sidecar.demo.supervise import Process, ProcessError, free_port, wait_ready

#: The repository root, when inferwatch runs from a source checkout (editable install).
REPO_ROOT = Path(__file__).resolve().parents[3]


def rules_generator() -> Path | None:
    """``alerts/generate.py`` of the source checkout, or None when not running from one."""
    gen = REPO_ROOT / "alerts" / "generate.py"
    return gen if gen.is_file() else None


def fast_rules(directory: Path) -> list[Path]:
    """Write the fast-profile rule files into ``directory``; returns them ([] without a checkout).

    Raises:
        RuntimeError: the generator failed (its output is in the message).
    """
    gen = rules_generator()
    if gen is None:
        return []
    r = subprocess.run([sys.executable, str(gen), "--fast", str(directory)], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{gen} --fast failed:\n{r.stdout}{r.stderr}")
    return sorted(directory.glob("*.yml"))


class DemoPrometheus:
    """One Prometheus process on 127.0.0.1 scraping ``targets`` every ``interval``.

    Args:
        binary: the prometheus executable.
        targets: ``host:port`` of each /metrics to scrape (job ``inferwatch``, as the rules expect).
        rule_files: rule files to load.
        interval: scrape and evaluation interval.
        alertmanagers: ``host:port`` of each Alertmanager to send alerts to (none: alerts stay in Prometheus).
    """

    def __init__(self, binary: str, targets: list[str], rule_files: list[Path], interval: str = "1s",
                 alertmanagers: list[str] | None = None) -> None:
        self.binary = binary
        self.targets = targets
        self.alertmanagers = list(alertmanagers or [])
        self.rule_files = rule_files
        self.interval = interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="iw-demo-prom-"))
        self.proc: Process | None = None

    def start(self, timeout: float = 30.0) -> DemoPrometheus:
        """Start Prometheus and wait until it is ready (and has discovered every Alertmanager).

        Raises:
            supervise.ProcessError: it exited, or was not ready within ``timeout`` seconds.
        """
        cfg: dict[str, object] = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{"job_name": "inferwatch", "static_configs": [{"targets": self.targets}]}],
        }
        if self.alertmanagers:
            cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": self.alertmanagers}]}]}
        cfg_path = self.dir / "prometheus.yml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        argv = [self.binary, f"--config.file={cfg_path}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
                "--enable-feature=exemplar-storage"]
        self.proc = Process("prometheus", argv, None, self.dir / "prometheus.log")
        deadline = time.monotonic() + timeout
        wait_ready(self.proc, f"{self.url}/-/ready", deadline)
        want = {f"http://{t}/api/v2/alerts" for t in self.alertmanagers}
        while not want <= self.active_alertmanagers():
            self.proc.check()
            if time.monotonic() > deadline:
                raise ProcessError(f"prometheus did not discover Alertmanager(s) {sorted(want)}:\n{self.log_tail()}")
            time.sleep(0.2)
        return self

    def active_alertmanagers(self) -> set[str]:
        """The URLs Prometheus sends alerts to now."""
        with urllib.request.urlopen(f"{self.url}/api/v1/alertmanagers", timeout=10) as r:
            return {a["url"] for a in json.loads(r.read())["data"]["activeAlertmanagers"]}

    def log_tail(self, n: int = 3000) -> str:
        """The end of Prometheus's log."""
        assert self.proc is not None, "start() first"
        return self.proc.log_tail(n)

    def stop(self) -> None:
        """Stop Prometheus and remove its directory."""
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
