"""``inferwatch demo --engine vllm``: the demo's timeline with vLLM serving a tiny LLM.

The same :class:`~.scenario.Scenario` (fault timeline, polling, live view,
summary), with what differs for an LLM engine:

- one vLLM (:mod:`.vllm_engine`) serves the tiny model of :mod:`.tiny_llm` and
  traces every request to the sidecar, which maps its ``llm_request`` spans
  with the ``vllm`` preset: the request (end to end), the ``queue``,
  ``prefill`` and ``decode`` stages, time to first token and tokens, and the
  span attributes in :data:`FEATURES` as drift features;
- the load is streamed completions (:mod:`.llm_loadgen`);
- drift is judged against a warm-up reference, the model's first
  :data:`WARMUP_EVENTS` requests (an LLM's prompts have no training table to
  profile), as a user with no reference file gets it;
- the faults an LLM engine can show are judged by :data:`SIGNALS`; the others
  are reported as not applicable (:data:`NOT_APPLICABLE`), never skipped;
- at the end the load generator's completions, the sidecar's counts from the
  spans and vLLM's own counters are set side by side (:class:`Reconciliation`).
"""

from __future__ import annotations

import dataclasses
import http.client
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from inferwatch_sidecar.demo import judge, promtext, report
from inferwatch_sidecar.demo import supervise as sv
from inferwatch_sidecar.demo import vllm_engine as ve
from inferwatch_sidecar.demo.config import ScenarioConfig
from inferwatch_sidecar.demo.inject import FaultState
from inferwatch_sidecar.demo.llm_loadgen import LlmLoadGenerator
from inferwatch_sidecar.demo.loadgen import LoadGenerator, LoadPlan
from inferwatch_sidecar.demo.observe import Snapshot
from inferwatch_sidecar.demo.promtext import Scrape
from inferwatch_sidecar.demo.scenario import Scenario

#: The ``model_version`` of vLLM's requests: its spans name none.
VERSION = ""
#: The span attributes that become drift features (``traces.features``).
FEATURES = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.request.max_tokens",
            "gen_ai.request.temperature")
#: Requests in the warm-up reference: about 8 s of the healthy load at 20 requests/s.
WARMUP_EVENTS = 150
#: Streams in flight at most (the load generator's threads): bounds vLLM's queue under the latency fault.
#: Saturated, a short request waits about (THREADS / MAX_NUM_SEQS - 1) mean service times: at 16 the queue
#: P99 reached only 0.79 s in one CI run in three on 2 shared cores (under the 1 s target); at 32 it read
#: 4.5 and 4.8 s in two runs of the demo test's timeline.
THREADS = 32
#: The P99 latency objective's target (alerts/source.py LATENCY_OBJECTIVES), for the queue stage.
P99_TARGET_S = 1.0

TITLES = {
    "latency": "latency: long generations fill vLLM's slots",
    "drift": "drift: prompts, max_tokens, temperature shift",
    "gpu_leak": "GPU memory leak in vLLM's worker (fake NVML)",
    "bad_events": "a client posting malformed JSON events",
}
#: Faults of the default demo that an LLM engine cannot show, and why.
NOT_APPLICABLE = {
    "confidence": "an LLM's spans carry no confidence",
    "canary": "a second vLLM server (about 1 GB and a minute of 2 CPU cores to start) is not offered",
}


def _queue_p99(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    q = snap.stages.get("queue", {})
    p99 = q.get(0.99)
    return (p99 is not None and p99 > P99_TARGET_S,
            f"queue P99 {report.seconds(p99)} (target {P99_TARGET_S:g}s), P99.9 {report.seconds(q.get(0.999))}")


def _drift(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    d = snap.drift.get((ve.MODEL_NAME, VERSION), {})
    ratio = d.get("drifted_ratio")
    if ratio is None:
        return False, "no drift evaluation yet (warm-up reference building)"
    flagged = sorted(f for f, v in d.get("features", {}).items() if v.get("drifted"))
    return bool(d.get("dataset_drifted")), (f"{len(flagged)} of {len(FEATURES)} span attributes drifted "
                                            f"({', '.join(flagged) or '-'}), share {ratio:.0%}")


#: Fault -> its detection signal, as :data:`.judge.SIGNALS` for the other engines.
SIGNALS: dict[str, judge.Signal] = {
    "latency": _queue_p99,
    "drift": _drift,
    "gpu_leak": judge.SIGNALS["gpu_leak"],
    "bad_events": judge.SIGNALS["bad_events"],
}
#: The alerts each fault must bring to ``firing`` (with the labels that must match).
EXPECTED_ALERTS: dict[str, judge.Alerts] = {
    "latency": [("InferwatchStageLatencyP99BudgetBurn", {"stage": "queue"}),
                ("InferwatchVLLMTimeToFirstTokenSlow", {"model_name": ve.MODEL_NAME})],
    "drift": [("InferwatchFeatureDrift", {"model": ve.MODEL_NAME})],
    "gpu_leak": judge.EXPECTED_ALERTS["gpu_leak"],
    "bad_events": judge.EXPECTED_ALERTS["bad_events"],
}


def fault_problem(faults: tuple[str, ...]) -> str | None:
    """Why ``faults`` cannot run with vLLM (None: they can): none of them applies."""
    if any(f in SIGNALS for f in faults):
        return None
    return (f"none of the faults {', '.join(faults)} applies to vLLM ({'; '.join(not_applicable(faults).values())}); "
            f"choose from {', '.join(SIGNALS)}")


def not_applicable(faults: tuple[str, ...]) -> dict[str, str]:
    """The faults of ``faults`` that vLLM cannot show, with the reason."""
    return {f: NOT_APPLICABLE.get(f, "not wired for an LLM engine") for f in faults if f not in SIGNALS}


@dataclasses.dataclass
class Reconciliation:
    """The end-of-run counts from the load generator, the sidecar (vLLM's spans) and vLLM's own /metrics."""

    sent: int
    sent_tokens: int
    requests: float
    ttft: float
    tokens: float
    vllm_requests: float
    vllm_ttft: float
    vllm_tokens: float

    @property
    def matches(self) -> bool:
        return (self.sent == self.requests == self.vllm_requests and self.requests == self.ttft == self.vllm_ttft
                and self.sent_tokens == self.tokens == self.vllm_tokens)

    def lines(self) -> list[str]:
        return [
            f"requests: load generator {self.sent} completions; sidecar {self.requests:.0f} "
            f"(inferwatch_requests_total); vLLM {self.vllm_requests:.0f} (vllm:request_success_total)",
            f"time to first token: sidecar {self.ttft:.0f} (inferwatch_time_to_first_token_seconds_count); "
            f"vLLM {self.vllm_ttft:.0f} (vllm:time_to_first_token_seconds_count)",
            f"generated tokens: load generator {self.sent_tokens}; sidecar {self.tokens:.0f} "
            f"(inferwatch_generated_tokens_total); vLLM {self.vllm_tokens:.0f} (vllm:generation_tokens_total)",
            "counts: " + ("the same on all three sides" if self.matches else "MISMATCH (spans lost or not yet sent)"),
        ]


class VllmScenario(Scenario):
    """The demo stack with vLLM serving; see the module docstring.

    Args:
        cfg: the scenario's knobs (``engine="vllm"``).
        model_dir: the tiny model's folder (default: :func:`.vllm_engine.model_cache_dir`).
    """

    signals = SIGNALS
    expected_alerts = EXPECTED_ALERTS
    titles = TITLES

    def __init__(self, cfg: ScenarioConfig, model_dir: Path | None = None) -> None:
        super().__init__(cfg)
        self.model_dir = model_dir
        self.vllm_url = self.stable_url
        self.not_applicable = not_applicable(self.cfg.faults)
        self.faults = {f: FaultState(f) for f in self.cfg.faults if f in SIGNALS}
        self.reconciliation: Reconciliation | None = None
        #: Why the counts could not be set side by side (a /metrics that could not be read), or None.
        self.reconciliation_error: str | None = None

    @property
    def vllm_target(self) -> str:
        """``host:port`` of vLLM's /metrics, for a Prometheus scrape config."""
        return f"127.0.0.1:{self.stable_port}"

    def scrape_targets(self) -> list[str]:
        return [self.sidecar_target, self.vllm_target]

    def urls(self) -> dict[str, str]:
        out = {"metrics": f"{self.sidecar_url}/metrics", "status": f"{self.sidecar_url}/v1/status",
               "model server": f"{self.vllm_url}/v1/completions", "vllm metrics": f"{self.vllm_url}/metrics"}
        if self.prometheus_url:
            out["prometheus"] = self.prometheus_url
        return out

    def start(self, timeout: float = 400.0, progress: Callable[[str], None] | None = None) -> None:
        """Write the tiny model (once), start vLLM and then the sidecar, and wait until both are ready.

        Raises:
            supervise.ProcessError: a process exited or did not become ready; the message includes its log.
        """
        say = progress or (lambda s: None)
        deadline = time.monotonic() + timeout
        for f, why in self.not_applicable.items():
            say(f"fault {f}: not applicable with --engine vllm ({why})")
        python = self.cfg.vllm_python or ve.default_vllm_python()
        say("writing the tiny model (once, into the cache)" if self.model_dir is None else "checking the tiny model")
        model, written = ve.ensure_model(python, self.workdir, self.model_dir)
        say(f"tiny model {'written to' if written else 'found in'} {model}")
        say(f"starting vLLM ({python}): {ve.MODEL_NAME}, {ve.MAX_NUM_SEQS} sequences at once "
            "(about a minute on 2 cores)")
        self.procs["stable"] = ve.start_vllm_server(python, model, port=self.stable_port, sidecar_url=self.sidecar_url,
                                                    log_dir=self.workdir)
        sv.wait_ready(self.procs["stable"], f"{self.vllm_url}/health", deadline)
        workers = ve.worker_pids(self.procs["stable"].p.pid)
        if not workers:
            raise sv.ProcessError(f"vLLM is ready but no {ve.WORKER_COMM} process runs under it:\n"
                                  f"{self.procs['stable'].log_tail()}")
        self.worker_pids = {"stable": workers}
        self.leak_pid = workers[0]
        cfg_path = self.workdir / "sidecar.yaml"
        cfg_path.write_text(yaml.safe_dump(self.sidecar_config("")))
        say("starting the sidecar")
        self.t0 = time.monotonic()
        self.procs["sidecar"] = sv.start_sidecar(cfg_path, self.workdir)
        sv.wait_ready(self.procs["sidecar"], f"{self.sidecar_url}/readyz", deadline, watch=self.procs.values())
        say("all processes are ready")

    def sidecar_config(self, reference: str) -> dict[str, Any]:
        """The demo's sidecar config, with the span features and a warm-up drift reference (``reference`` unused)."""
        doc = super().sidecar_config("")
        drift = doc["drift"]
        del drift["reference"]
        # Under the latency fault vLLM finishes about 8 requests/s: a 10 s window must still be judged.
        drift.update({"reference_mode": "warmup", "warmup_events": WARMUP_EVENTS, "min_samples": 40})
        doc["traces"] = {"features": list(FEATURES)}
        return doc

    def load_generator(self, plan: LoadPlan) -> LoadGenerator:
        return LlmLoadGenerator(self.vllm_url, self.sidecar_url, dataclasses.replace(plan, threads=THREADS),
                                model=ve.MODEL_NAME)

    def inject(self) -> None:
        """Switch every applicable fault on: all of them live in the load generator or the fake NVML."""
        lg = self.loadgen
        assert isinstance(lg, LlmLoadGenerator), "run() starts the load first"
        lg.latency = "latency" in self.faults
        lg.drift = "drift" in self.faults
        lg.bad_events = "bad_events" in self.faults
        # The leak's device side is scripted in the fake NVML's config from the start (inject.fake_gpu_processes).

    def stop_load(self, wait_s: float = 15.0) -> None:
        """Stop the load (the streams in flight end), wait for their spans, judge once more, and set the
        counts side by side.

        The streams still in flight at the end are the ones that queued longest behind the latency fault's
        long generations; their spans reach the sidecar only when they end, so the faults are judged again
        once they have. A /metrics that cannot be read leaves :attr:`reconciliation_error` instead: the run
        fails, saying why.
        """
        lg = self.loadgen
        if not isinstance(lg, LlmLoadGenerator) or self.reconciliation is not None or self.reconciliation_error:
            return
        lg.stop(timeout=60.0)
        sent = lg.snapshot()
        deadline = time.monotonic() + wait_s
        url = f"{self.sidecar_url}/metrics"
        try:
            while True:
                ours = Scrape(promtext.fetch(url), self.now())
                if (ours.value("inferwatch_requests_total", 0.0, model=ve.MODEL_NAME) or 0) >= \
                        sent.get("completions", 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            url = f"{self.vllm_url}/metrics"
            theirs = Scrape(promtext.fetch(url), self.now())
        except (OSError, http.client.HTTPException) as e:
            self.reconciliation_error = f"counts: NOT COMPARED: {url} could not be read ({e})"
            return
        self.poll()
        m = {"model": ve.MODEL_NAME}
        v = {"model_name": ve.MODEL_NAME}
        self.reconciliation = Reconciliation(
            sent=sent.get("completions", 0), sent_tokens=sent.get("completion_tokens", 0),
            requests=ours.value("inferwatch_requests_total", 0.0, **m) or 0.0,
            ttft=ours.value("inferwatch_time_to_first_token_seconds_count", 0.0, **m) or 0.0,
            tokens=ours.value("inferwatch_generated_tokens_total", 0.0, **m) or 0.0,
            vllm_requests=theirs.value("vllm:request_success_total", 0.0, **v) or 0.0,
            vllm_ttft=theirs.value("vllm:time_to_first_token_seconds_count", 0.0, **v) or 0.0,
            vllm_tokens=theirs.value("vllm:generation_tokens_total", 0.0, **v) or 0.0)

    def all_detected(self) -> bool:
        """Every applicable fault detected, and the three sides' counts equal."""
        return super().all_detected() and self.reconciliation is not None and self.reconciliation.matches

    def summary_lines(self) -> list[str]:
        """The summary as with the other engines, the not-applicable faults, and the counts side by side."""
        return report.summary_lines(self.faults, self.cfg.injection_time(),
                                    self.unexpected_alerts() if self.prometheus_url else None,
                                    self.receiver.notifications() if self.receiver is not None else None,
                                    titles=self.titles, not_applicable=self.not_applicable,
                                    extra=(self.reconciliation.lines() if self.reconciliation is not None
                                           else [self.reconciliation_error] if self.reconciliation_error else None),
                                    passed=self.all_detected())
