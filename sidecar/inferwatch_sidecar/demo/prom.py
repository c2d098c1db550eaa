"""Run Prometheus for the demo: on loopback, scraping the sidecar every second, with our rules.

The rules come from ``alerts/generate.py --fast`` (the same alerts as
production with windows and ``for:`` durations divided by 60), which lives in
a source checkout of inferwatch. Without it Prometheus still runs and shows
the metrics, with no alerts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from inferwatch_sidecar.demo.supervise import Process, free_port, wait_ready

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
    """

    def __init__(self, binary: str, targets: list[str], rule_files: list[Path], interval: str = "1s") -> None:
        self.binary = binary
        self.targets = targets
        self.rule_files = rule_files
        self.interval = interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="iw-demo-prom-"))
        self.proc: Process | None = None

    def start(self, timeout: float = 30.0) -> DemoPrometheus:
        """Start Prometheus and wait until it is ready.

        Raises:
            supervise.ProcessError: it exited, or was not ready within ``timeout`` seconds.
        """
        cfg = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{"job_name": "inferwatch", "static_configs": [{"targets": self.targets}]}],
        }
        cfg_path = self.dir / "prometheus.yml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        argv = [self.binary, f"--config.file={cfg_path}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
                "--enable-feature=exemplar-storage"]
        self.proc = Process("prometheus", argv, None, self.dir / "prometheus.log")
        wait_ready(self.proc, f"{self.url}/-/ready", time.monotonic() + timeout)
        return self

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
