"""Record ``tests/fixtures/vllm_spans.json`` and ``vllm_metrics.txt`` from a real vLLM.

Serves the tiny model, sends ``vllm_engine.TRAFFIC`` with trace IDs of its
own, and takes vLLM's ``/metrics`` after it. vLLM's span exporter is given a
delay longer than the run, so it sends the API server's spans (start-up
spans and every ``llm_request``) in one export when vLLM stops; a loopback
OTLP endpoint here keeps that export, written out as OTLP/JSON (hex IDs,
integer enums) for ``test_vllm.py``'s recorded-export test.

Run: ``.venv/bin/python -m tests.traces.record_vllm_fixtures`` (needs ``.venv-vllm``).
"""

from __future__ import annotations

import base64
import http.server
import json
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.helpers.net import free_port
from tests.helpers.sidecar import REPO
from tests.traces import vllm_engine as engine

FIXTURES = Path(REPO) / "tests" / "fixtures"


class Capture(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        n = int(self.headers.get("Content-Length", "0"))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(415)
            return
        Capture.bodies.append(self.rfile.read(n))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def otlp_json(body: bytes) -> dict[str, Any]:
    """An export as OTLP/JSON: protobuf's JSON mapping with trace and span IDs in hex, enums as integers."""
    doc: dict[str, Any] = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body),
                                                    use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = base64.b64decode(s[k]).hex()
    return doc


def main() -> None:
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    trace_ids = [f"{0xF1C5000 + i:032x}" for i in range(len(engine.TRAFFIC))]
    with tempfile.TemporaryDirectory() as tmp:
        model, log = Path(tmp) / "model", Path(tmp) / "vllm.log"
        engine.make_model(model, log)
        with engine.serve(model, f"http://127.0.0.1:{port}/v1/traces", log, bsp_delay_ms=600_000) as vport:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda i: engine.stream_completion(vport, *engine.TRAFFIC[i], trace_ids[i]),
                              range(len(engine.TRAFFIC))))
            metrics = engine.scrape(vport)
    server.shutdown()
    exports = [otlp_json(b) for b in Capture.bodies]
    with_requests = [d for d in exports if '"llm_request"' in json.dumps(d)]
    if len(with_requests) != 1:
        sys.exit(f"expected one export with the llm_request spans, got {len(with_requests)} of {len(exports)}")
    (FIXTURES / "vllm_metrics.txt").write_text(metrics)
    (FIXTURES / "vllm_spans.json").write_text(json.dumps(with_requests[0], indent=1) + "\n")
    print(f"wrote {FIXTURES / 'vllm_metrics.txt'} and {FIXTURES / 'vllm_spans.json'} "
          f"({len(exports)} exports received)")


if __name__ == "__main__":
    main()
