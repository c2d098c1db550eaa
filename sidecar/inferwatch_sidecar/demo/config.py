"""The scenario's knobs (:class:`ScenarioConfig`) and the names of the faults it can inject."""

from __future__ import annotations

from dataclasses import dataclass

#: The faults the demo injects by default, in display order.
FAULTS = ("latency", "drift", "confidence", "gpu_leak", "canary")
#: Every fault the scenario knows; ``bad_events`` (a client posting malformed JSON events) is opt-in.
ALL_FAULTS = (*FAULTS, "bad_events")
#: Opt-in faults outside :data:`ALL_FAULTS` (the end-to-end run's set): ``saturation`` runs the server into a
#: KV-cache-bound phase, then a host-CPU-bound one, which the saturation verdict names (the demo server
#: exposes its engine facts, :mod:`.engine_sim`; docs/saturation.md).
OPT_IN = ("saturation",)
#: Variants of a fault, opt-in, which replace it in a run: ``long_inputs`` is the latency fault's (long inputs
#: fill the batch and the queue; tail attribution names the queue and the input length); ``retry_storm`` slows
#: every batch past the clients' timeout, and the clients give up and retry at once with the same request ID
#: (docs/overload.md).
VARIANTS = {"long_inputs": "latency", "retry_storm": "latency"}
#: Every fault name ``--faults`` accepts.
KNOWN_FAULTS = (*ALL_FAULTS, *VARIANTS, *OPT_IN)
#: The engines that can serve the demo: the SDK-instrumented FastAPI server, Triton (PyTriton), or vLLM
#: (a tiny LLM, its own scenario: :mod:`.vllm_scenario`).
ENGINES = ("fastapi", "triton", "vllm")


@dataclass
class ScenarioConfig:
    """Every knob of the scenario; the defaults are the demo's embedded configuration.

    Attributes:
        duration_s: how long the load runs (from the sidecar's start).
        inject_at_s: when every fault is injected (from the sidecar's start); None: 30% of the duration,
            at least 12 s.
        rate_per_s: total request rate of the load generator.
        max_requests: request bound of the load generator.
        latency_share / latency_delay_s: share of inference batches slowed, and by how much.
        hard_share: the confidence fault's share of inputs from the hard segment (all of them: with less,
            the estimate sits too close to InferwatchEstimatedAccuracyLow's floor, see docs/demo.md).
        long_input_share: the ``long_inputs`` fault's share of predictions with a long note.
        canary_share: share of predictions routed to the canary, from the start (its fault comes at the injection).
        leak_mib_per_s: the fake NVML leak's rate.
        faults: which faults to inject (a subset of :data:`ALL_FAULTS`).
        seed: dataset seed.
        workdir: where configs and logs go (a fresh temporary directory by default, removed at stop).
        tick_s: how often the runner polls.
        engine: what serves the model (one of :data:`ENGINES`).
        triton_python: the Python that runs the Triton server (None: see
            :func:`~inferwatch_sidecar.demo.supervise.default_triton_python`).
        vllm_python: the Python that runs vLLM (None: see
            :func:`~inferwatch_sidecar.demo.vllm_engine.default_vllm_python`).

    Raises:
        ValueError: ``faults`` names a fault the scenario does not know (or a variant with the fault it
            replaces, or one the engine cannot serve), or ``engine`` an unknown engine.
    """

    duration_s: float = 90.0
    inject_at_s: float | None = None
    rate_per_s: float = 50.0
    max_requests: int = 50_000
    latency_share: float = 0.08
    latency_delay_s: float = 3.0
    hard_share: float = 1.0
    long_input_share: float = 0.05
    canary_share: float = 0.4
    leak_mib_per_s: float = 64.0
    faults: tuple[str, ...] = FAULTS
    seed: int = 0
    workdir: str | None = None
    tick_s: float = 0.5
    engine: str = "fastapi"
    triton_python: str | None = None
    vllm_python: str | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; known: {', '.join(ENGINES)}")
        for f in self.faults:
            if f not in KNOWN_FAULTS:
                raise ValueError(f"unknown fault {f!r}; known: {', '.join(KNOWN_FAULTS)}")
            if VARIANTS.get(f) in self.faults:
                raise ValueError(f"fault {f!r} replaces {VARIANTS[f]!r}: inject one of them")
        if "long_inputs" in self.faults and self.engine != "fastapi":
            raise ValueError("fault 'long_inputs' needs the FastAPI server's batcher (engine 'fastapi')")
        if "saturation" in self.faults and self.engine != "fastapi":
            raise ValueError("fault 'saturation' needs the FastAPI server's engine facts (engine 'fastapi')")
        if "retry_storm" in self.faults and self.engine != "fastapi":
            raise ValueError("fault 'retry_storm' needs the SDK's ASGI middleware (engine 'fastapi')")

    def load_scale(self, t: float) -> float:
        """The share of ``rate_per_s`` sent at scenario time ``t``: half until half-way to the injection, then all.

        The load rises once, so the capacity table sees throughput grow with the requests in flight (the
        rising line of the live knee); at one constant rate every level has the same throughput, and the
        knee is not identifiable (docs/capacity.md).
        """
        return 0.5 if t < 0.5 * self.injection_time() else 1.0

    def injection_time(self) -> float:
        """Seconds from the sidecar's start at which every fault is switched on."""
        if self.inject_at_s is not None:
            return self.inject_at_s
        return max(12.0, 0.3 * self.duration_s)
