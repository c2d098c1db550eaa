"""A PyTriton server for the trace tests: one numpy model with dynamic batching, traced to a sidecar.

Usage: python -m tests.traces.triton_app SIDECAR_URL SOCKET HTTP_PORT GRPC_PORT METRICS_PORT TRACE_LOG

The callable records each request's input as drift features with
``inferwatch.record()`` inside a request scope whose ID is the request's
trace ID (PyTriton hands the callable an OpenTelemetry span per request,
child of Triton's), and appends that trace ID to TRACE_LOG. SIGTERM stops
Triton with ``triton.stop()``: without it tritonserver outlives this process.
"""

from __future__ import annotations

import signal
import sys
import threading

import numpy as np
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

import inferwatch


def main() -> None:
    sidecar_url, sock, http_port, grpc_port, metrics_port, trace_log = sys.argv[1:7]
    inferwatch.configure(service="triton-python", model="double", model_version="1", sidecar=f"unix://{sock}",
                         flush_interval_ms=20)
    seen = open(trace_log, "a", buffering=1)  # noqa: SIM115 - closed at exit

    def infer(requests: list) -> list[dict[str, np.ndarray]]:
        out = []
        for r in requests:
            x = r["x"]
            tid = f"{r.span.get_span_context().trace_id:032x}"
            with inferwatch.request(request_id=tid, trace_id=tid):
                inferwatch.record(prediction=float(x.sum()), features={"x0": float(x[0, 0]), "x1": float(x[0, 1])})
            seen.write(tid + "\n")
            out.append({"y": x * 2})
        return out

    cfg = TritonConfig(
        http_port=int(http_port), grpc_port=int(grpc_port), metrics_port=int(metrics_port), log_verbose=0,
        trace_config=["mode=opentelemetry", "rate=1", "level=TIMESTAMPS",
                      f"opentelemetry,url={sidecar_url}/v1/traces", "opentelemetry,resource=service.name=triton"],
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    triton = Triton(config=cfg)
    try:
        triton.bind(
            model_name="double", infer_func=infer,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=5000)),
        )
        triton.run()
        print("READY", flush=True)
        stop.wait()
    finally:
        triton.stop()
        inferwatch.shutdown()
        seen.close()


if __name__ == "__main__":
    main()
