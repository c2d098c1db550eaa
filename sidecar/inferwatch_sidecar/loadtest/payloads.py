"""What ``inferwatch loadtest`` sends: OpenAI completions or chat (optionally streamed) or any JSON body.

Prompt and output lengths come from a file of real prompts (one per line: text, or JSON with ``prompt``
or ``messages`` and optionally ``max_tokens``) or from a lognormal distribution with the given mean and
standard deviation in tokens. A synthetic prompt of ``n`` tokens is ``n`` common words (about one token
each for a BPE tokenizer). Every request body is built before the run, so the hot path only writes bytes.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwatch_sidecar.loadtest.client import build_request

KINDS = ("completions", "chat", "json")
#: Most distinct request bodies prepared (they are cycled).
MAX_BODIES = 4096
_WORDS = ["the", "model", "serves", "tokens", "to", "every", "request", "while", "its", "cache", "holds", "keys", "and", "values", "for", "each", "layer", "of", "attention", "so", "that", "later", "steps", "reuse", "them"]


class PayloadError(ValueError):
    """A payload option that cannot work (the message says what to fix)."""


@dataclass(frozen=True)
class Length:
    """A token-length distribution: lognormal with this mean and standard deviation (0: always the mean)."""

    mean: float
    std: float = 0.0

    @staticmethod
    def parse(text: str, what: str) -> Length:
        try:
            parts = [float(p) for p in text.split(",")]
        except ValueError:
            raise PayloadError(f"{what} {text!r}: expected MEAN or MEAN,STDDEV in tokens") from None
        if len(parts) not in (1, 2) or parts[0] < 1 or (len(parts) == 2 and parts[1] < 0):
            raise PayloadError(f"{what} {text!r}: expected MEAN (at least 1) or MEAN,STDDEV (at least 0)")
        return Length(parts[0], parts[1] if len(parts) == 2 else 0.0)

    def draw(self, rng: random.Random) -> int:
        if self.std <= 0:
            return max(1, round(self.mean))
        s2 = math.log1p((self.std / self.mean) ** 2)
        return max(1, round(rng.lognormvariate(math.log(self.mean) - s2 / 2, math.sqrt(s2))))


@dataclass(frozen=True)
class Prepared:
    """One request, ready to write, and what it asked for."""

    raw: bytes
    max_tokens: int


def synthetic_prompt(n: int, rng: random.Random) -> str:
    start = rng.randrange(len(_WORDS))
    return " ".join(_WORDS[(start + i) % len(_WORDS)] for i in range(n))


def read_prompts(path: str) -> list[dict[str, Any]]:
    """Prompts from ``path``: one per line, plain text or a JSON object with prompt/messages[, max_tokens]."""
    out: list[dict[str, Any]] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PayloadError(f"--prompts {path}: {e}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PayloadError(f"--prompts {path} line {i}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not ({"prompt", "messages"} & obj.keys()):
                raise PayloadError(f"--prompts {path} line {i}: a JSON line needs \"prompt\" or \"messages\"")
            out.append(obj)
        else:
            out.append({"prompt": line})
        if len(out) >= MAX_BODIES:
            break
    if not out:
        raise PayloadError(f"--prompts {path}: no prompts in the file")
    return out


def read_bodies(body: str | None, body_file: str | None) -> list[bytes]:
    """The generic JSON bodies: ``--body`` or ``--body-file`` (one JSON per line), each checked to be JSON."""
    texts: list[tuple[str, str]] = []
    if body is not None:
        texts.append(("--body", body))
    if body_file is not None:
        try:
            lines = Path(body_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise PayloadError(f"--body-file {body_file}: {e}") from None
        texts += [(f"--body-file {body_file} line {i}", ln) for i, ln in enumerate(lines, 1) if ln.strip()]
    if not texts:
        return [b"{}"]
    out = []
    for where, t in texts[:MAX_BODIES]:
        try:
            json.loads(t)
        except json.JSONDecodeError as e:
            raise PayloadError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
        out.append(t.encode())
    return out


def build(kind: str, host: str, path: str, *, model: str | None, stream: bool, prompts: list[dict[str, Any]] | None,
          prompt_len: Length, output_len: Length, bodies: list[bytes] | None, headers: dict[str, str],
          ignore_eos: bool, count: int, seed: int) -> list[Prepared]:
    """``count`` (at most MAX_BODIES) prepared requests of ``kind``, cycled by the runner."""
    if kind not in KINDS:
        raise PayloadError(f"--api {kind!r}: expected one of {', '.join(KINDS)}")
    hdr = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
    hdr.update(headers)
    if kind == "json":
        return [Prepared(build_request("POST", host, path, b, hdr), 0) for b in (bodies or [b"{}"])]
    rng = random.Random(seed)
    out = []
    for i in range(max(1, min(count, MAX_BODIES))):
        src = prompts[i % len(prompts)] if prompts else None
        max_tokens = int(src["max_tokens"]) if src and "max_tokens" in src else output_len.draw(rng)
        req: dict[str, Any] = {"max_tokens": max_tokens, "stream": stream}
        if model:
            req["model"] = model
        if stream:
            req["stream_options"] = {"include_usage": True}
        if ignore_eos:
            req["ignore_eos"] = True
        if kind == "chat":
            if src and "messages" in src:
                req["messages"] = src["messages"]
            else:
                text = src["prompt"] if src else synthetic_prompt(prompt_len.draw(rng), rng)
                req["messages"] = [{"role": "user", "content": text}]
        else:
            if src and "prompt" not in src:
                req["prompt"] = " ".join(str(m.get("content", "")) for m in src["messages"] if isinstance(m, dict))
            else:
                req["prompt"] = src["prompt"] if src else synthetic_prompt(prompt_len.draw(rng), rng)
        out.append(Prepared(build_request("POST", host, path, json.dumps(req).encode(), hdr), max_tokens))
    return out


def default_path(kind: str) -> str:
    return {"completions": "/v1/completions", "chat": "/v1/chat/completions"}.get(kind, "/")
