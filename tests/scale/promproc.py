"""A Prometheus process on loopback with the flags and scrape configs a test picks (native histograms on or off)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from inferwatch_sidecar.demo.supervise import Process, free_port, wait_ready


class Prom:
    """Prometheus scraping ``scrape_configs`` every ``interval``, with rule files and extra flags.

    Args:
        binary: the prometheus executable.
        scrape_configs: Prometheus ``scrape_configs`` entries.
        native: start with ``--enable-feature=native-histograms`` (it then asks for protobuf first).
        rule_files: rule files to load.
        interval: scrape and evaluation interval.
    """

    def __init__(self, binary: str, scrape_configs: list[dict[str, Any]], *, native: bool,
                 rule_files: list[Path] | None = None, interval: str = "1s") -> None:
        self.binary = binary
        self.scrape_configs = scrape_configs
        self.native = native
        self.rule_files = [str(Path(p).resolve()) for p in rule_files or []]
        self.interval = interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="iw-scale-prom-"))
        self.proc: Process | None = None

    def __enter__(self) -> Prom:
        cfg = {"global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
               "rule_files": self.rule_files, "scrape_configs": self.scrape_configs}
        path = self.dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        argv = [self.binary, f"--config.file={path}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
                "--enable-feature=exemplar-storage"]
        if self.native:
            argv.append("--enable-feature=native-histograms")
        self.proc = Process("prometheus", argv, None, self.dir / "prometheus.log")
        wait_ready(self.proc, f"{self.url}/-/ready", time.monotonic() + 30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def api(self, path: str, **params: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=30) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus API {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def metric(self, name: str) -> float:
        """One of Prometheus' own metrics (from its /metrics), summed over its series."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log(self) -> str:
        return "" if self.proc is None else self.proc.log_tail(4000)
