"""The demo model served by Triton (PyTriton), traced to the sidecar with OpenTelemetry.

``inferwatch demo --engine triton`` runs this module with a Python that has
PyTriton (which pins numpy<2, so usually a venv of its own), in a child process::

    INFERWATCH_SIDECAR=unix:///tmp/iw/ingest.sock python -m inferwatch_sidecar.demo.triton_server \\
        --role stable --sidecar-url http://127.0.0.1:9464 --http-port 8000 --grpc-port 8001 --metrics-port 8002

It serves the model ``credit-risk`` with dynamic batching and :data:`INSTANCES`
instances (one thread each here): ``--role stable`` serves the stable model as
Triton version 1 (SDK version ``v1``), ``--role canary`` the canary model as
Triton version 2 (SDK version ``v2``), each in its own process, as the FastAPI
demo runs a canary server beside the stable one. As there, the canary serves
the stable model until the fault file's ``canary_fault`` is set, then the
faulty one (other class biases), :data:`~inferwatch_sidecar.demo.faults.CANARY_SLOWDOWN_S`
slower per batch: the canary judge passes it, then fails it.

Inputs per request: ``numeric`` (FP32, the eight numeric features in
:data:`~inferwatch_sidecar.demo.model.NUMERIC_NAMES` order) and ``region``
(BYTES); outputs ``prediction`` (BYTES) and ``confidence`` (FP32).

What inferwatch gets from it, with no code in the request path: Triton posts a
trace per request to the sidecar's ``/v1/traces`` (queue, compute input,
infer and output times become the ``queue``, ``preprocess``, ``inference``
and ``postprocess`` stages). The only SDK call is ``inferwatch.record()``
inside the callable (the Python-backend case), with the model's version
(``v1`` or ``v2``, the reference profile's and the canary comparison's). It
records outside a request scope: a scope would send a second request event
for each of Triton's, so there is no request ID for ground-truth labels to
join, and the load generator sends none.

The faults come from the demo's fault file (``INFERWATCH_DEMO_STATE_DIR``),
as in the FastAPI server: the latency spike and the faulty canary's slowdown
sleep in the callable (Triton's compute infer time), the confidence
temperature divides the logits, and the leaking allocator feeds the SDK's
allocator probe. SIGTERM stops Triton with ``triton.stop()``: without it
tritonserver outlives this process.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig
except ImportError as e:  # pragma: no cover - depends on the interpreter
    raise ImportError(
        f"the Triton demo server needs PyTriton ({e.name} is missing): "
        'pip install "nvidia-pytriton>=0.7,<0.8" opentelemetry-sdk opentelemetry-exporter-otlp-proto-http '
        "(PyTriton pins numpy<2: use a virtualenv of its own)") from e

import inferwatch
from inferwatch_sidecar.demo import allocator
from inferwatch_sidecar.demo import faults as fl
from inferwatch_sidecar.demo import model as mdl

#: Role -> (Triton version, SDK version) of the model that role serves.
ROLES = {"stable": (1, mdl.STABLE), "canary": (2, mdl.CANARY)}
#: Model instances: a latency-faulted call holds its instance for seconds, as in a real Triton.
INSTANCES = 4
MAX_BATCH = 32
BATCH_DELAY_US = 2000
#: The service name the Triton spans and the SDK records report.
SERVICE = "demo-credit-triton"
#: Start-up attempts when a model instance loses PyTriton's handshake race (see :func:`restart_on_handshake_race`).
START_ATTEMPTS = 4
ATTEMPT_ENV = "INFERWATCH_DEMO_TRITON_ATTEMPT"


class Instance:
    """One model instance's callable: predicts a batch of requests, applies the faults, records each request.

    Args:
        model: the model served while ``canary_fault`` is off.
        bad_model: the model served once it is on (None: the fault does not touch this role).
        faults: the fault file's view.
        seed: the latency fault's random draws.
    """

    def __init__(self, model: mdl.Model, bad_model: mdl.Model | None, faults: fl.FaultReader, seed: int) -> None:
        self.model = model
        self.bad_model = bad_model
        self.faults = faults
        self.rng = random.Random(seed)

    def __call__(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        f = self.faults.get()
        model = self.bad_model if f.canary_fault and self.bad_model is not None else self.model
        sizes = [len(r["numeric"]) for r in requests]
        numeric = np.concatenate([r["numeric"] for r in requests]).astype(np.float64)
        regions = [v.decode() if isinstance(v, bytes) else str(v)
                   for r in requests for v in r["region"].reshape(-1)]
        pred, conf = model.predict(numeric, regions, f.confidence_temperature)
        if f.latency_stage == "inference" and f.latency_delay_s > 0 and self.rng.random() < f.latency_share:
            time.sleep(f.latency_delay_s)
        if model is self.bad_model:
            time.sleep(fl.CANARY_SLOWDOWN_S)
        out: list[dict[str, np.ndarray]] = []
        start = 0
        for n in sizes:
            rows = slice(start, start + n)
            start += n
            for k in range(rows.start, rows.stop):
                feats: dict[str, Any] = dict(zip(mdl.NUMERIC_NAMES, numeric[k].tolist(), strict=True))
                feats[mdl.CATEGORICAL_NAME] = regions[k] or None
                inferwatch.record(prediction=pred[k], confidence=float(conf[k]), features=feats)
            out.append({"prediction": np.array([[p.encode()] for p in pred[rows]], dtype=np.object_),
                        "confidence": conf[rows].astype(np.float32).reshape(-1, 1)})
        return out


def _write_pid_file(state_dir: str | None, role: str) -> None:
    if not state_dir:
        return
    d = os.path.join(state_dir, "pids")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{role}-{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))


def _configure_sdk(state_dir: str | None, version: str, timeout_s: float = 120.0) -> None:
    """Configure the SDK once the sidecar's socket (``INFERWATCH_SIDECAR``) exists, with the allocator probe."""
    path = os.environ.get("INFERWATCH_SIDECAR", "").removeprefix("unix://")
    deadline = time.monotonic() + timeout_s
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    alloc_faults = fl.FaultReader(os.path.join(state_dir, "faults.json") if state_dir else None, check_s=0.5)
    inferwatch.configure(service=SERVICE, model=mdl.NAME, model_version=version, flush_interval_ms=50,
                         torch_probe=True, torch_probe_interval_s=1.0,
                         torch_stats_source=lambda: allocator.memory_stats(alloc_faults.get(), os.getpid(),
                                                                           time.time()))


def trace_config(sidecar_url: str) -> list[str]:
    """Triton's ``--trace-config``: every request traced (timestamps), sent as OTLP/HTTP to the sidecar."""
    return ["mode=opentelemetry", "rate=1", "level=TIMESTAMPS",
            f"opentelemetry,url={sidecar_url.rstrip('/')}/v1/traces",
            f"opentelemetry,resource=service.name={SERVICE}",
            # Export every half second, not every 5 s: the live view follows the load closely.
            "opentelemetry,bsp_schedule_delay=500"]


def bind_model(triton: Triton, role: str, state_dir: str | None, seed: int) -> None:
    """Bind the role's model with :data:`INSTANCES` callables."""
    fault_path = os.path.join(state_dir, "faults.json") if state_dir else None
    stable, _ = mdl.train(seed)
    canary = role == "canary"
    model = stable.healthy_canary() if canary else stable
    bad_model = stable.canary() if canary else None
    funcs: list[Callable[[list[Any]], list[dict[str, np.ndarray]]]] = [
        Instance(model, bad_model, fl.FaultReader(fault_path), seed=os.getpid() * 100 + i) for i in range(INSTANCES)]
    triton.bind(
        model_name=mdl.NAME, model_version=ROLES[role][0], infer_func=funcs,
        inputs=[Tensor(name="numeric", dtype=np.float32, shape=(len(mdl.NUMERIC_NAMES),)),
                Tensor(name="region", dtype=np.bytes_, shape=(1,))],
        outputs=[Tensor(name="prediction", dtype=np.bytes_, shape=(1,)),
                 Tensor(name="confidence", dtype=np.float32, shape=(1,))],
        config=ModelConfig(max_batch_size=MAX_BATCH,
                           batcher=DynamicBatcher(max_queue_delay_microseconds=BATCH_DELAY_US)),
    )


def handshake_race(e: BaseException) -> bool:
    """Whether a failed ``triton.run()`` is PyTriton's start-up race between model instances.

    PyTriton's first instance of a model opens a Unix socket that hands the other instances their
    config; they wait for it one second only. With PyTriton's default tensor store, the first instance
    starts a multiprocessing manager (a new process) before it opens that socket, which on a loaded
    machine takes longer: a waiting instance times out or is refused, and the whole model's load fails
    ("load failed for model ...: get_config_from_handshake_server ... ConnectionRefusedError"). Nothing in
    the model is wrong. :func:`main` sets ``PYTRITON_NO_TENSORSTORE`` so that the first instance opens the
    socket at once, which makes the race rare; the restart covers what is left (a connect between
    ``bind()`` and ``listen()``).
    """
    msg = str(e)
    return "load failed" in msg and "handshake" in msg


def restart_on_handshake_race(e: BaseException, argv: list[str], attempts: int = START_ATTEMPTS,
                              cleanup: Callable[[], None] = lambda: None) -> None:
    """After ``triton.run()`` failed with ``e``: on PyTriton's handshake race, start this server afresh.

    The server re-executes itself (``python -m inferwatch_sidecar.demo.triton_server ARGV``, the same PID,
    so the demo's supervisor and PID file stay right), counting attempts in
    ``INFERWATCH_DEMO_TRITON_ATTEMPT``; a fresh process, because a second ``Triton.run()`` in this one
    forks tritonserver with OpenTelemetry's after-fork hook in place, and that hook deadlocks the child.
    ``cleanup`` runs just before (stop Triton and the SDK: ``execv`` skips every ``finally``). Returns
    (the caller raises ``e``) for any other failure, or the race on the last attempt.
    """
    attempt = int(os.environ.get(ATTEMPT_ENV, "1"))
    if attempt >= attempts or not handshake_race(e):
        return
    print(f"triton_server: a model instance lost PyTriton's start-up handshake race "
          f"(attempt {attempt} of {attempts}); starting Triton again", file=sys.stderr, flush=True)
    cleanup()
    os.environ[ATTEMPT_ENV] = str(attempt + 1)
    os.execv(sys.executable, [sys.executable, "-m", "inferwatch_sidecar.demo.triton_server", *argv])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=tuple(ROLES), required=True, help="serve the stable or the canary model")
    p.add_argument("--sidecar-url", required=True, help="the sidecar's HTTP address (traces go to /v1/traces)")
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    state_dir = os.environ.get("INFERWATCH_DEMO_STATE_DIR")
    seed = int(os.environ.get("INFERWATCH_DEMO_SEED", "0"))
    # Base64 tensors instead of PyTriton's shared-memory tensor store: the demo's tensors are a few bytes a
    # request, and the store's manager process, started before the first instance's handshake socket
    # opens, loses the other instances' one-second wait on a loaded machine (see handshake_race). Both
    # sides read it: this process when binding, the python-backend stubs through tritonserver's env.
    os.environ.setdefault("PYTRITON_NO_TENSORSTORE", "1")
    # PyTriton's python-backend stub loads libpython: tritonserver (our child) must find this interpreter's own.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    os.environ["LD_LIBRARY_PATH"] = ":".join(x for x in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if x)
    _write_pid_file(state_dir, args.role)
    # The scenario starts the sidecar once Triton is ready, so the SDK is configured once the sidecar's socket
    # exists (until then record() does nothing, and no request arrives anyway).
    threading.Thread(target=_configure_sdk, args=(state_dir, ROLES[args.role][1]), name="iw-demo-sdk", daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cfg = TritonConfig(http_address="127.0.0.1", grpc_address="127.0.0.1", http_port=args.http_port,
                       grpc_port=args.grpc_port, metrics_address="127.0.0.1", metrics_port=args.metrics_port,
                       log_verbose=0,
                       trace_config=trace_config(args.sidecar_url))
    triton = Triton(config=cfg)

    def cleanup() -> None:
        triton.stop()
        inferwatch.shutdown()

    try:
        bind_model(triton, args.role, state_dir, seed)
        try:
            triton.run()
        except Exception as e:
            restart_on_handshake_race(e, argv, cleanup=cleanup)
            raise
        print("READY", flush=True)
        stop.wait()
    finally:
        cleanup()


if __name__ == "__main__":
    main()
