"""The engine-metrics parser against prometheus_client's own parser, on real engine bodies and random ones."""

from __future__ import annotations

import math
import random

from prometheus_client.parser import text_string_to_metric_families

from inferwatch_sidecar.components.engines import kinds, promtext
from tests.helpers.paths import FIXTURES


def reference(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def same(a: list[tuple[str, dict[str, str], float]], b: list[tuple[str, dict[str, str], float]]) -> bool:
    def key(x: tuple[str, dict[str, str], float]) -> tuple[str, tuple[tuple[str, str], ...], str]:
        return x[0], tuple(sorted(x[1].items())), "nan" if math.isnan(x[2]) else repr(float(x[2]))
    return sorted(map(key, a)) == sorted(map(key, b))


def test_real_engine_bodies_parse_like_prometheus_client() -> None:
    for name in ("vllm_metrics.txt", "triton_metrics.txt"):
        text = (FIXTURES / name).read_text()
        ours = promtext.parse(text)
        assert ours.bad_lines == 0
        theirs = reference(text)
        # prometheus_client renames counters without _total (Triton's) to name_total; compare on values then.
        assert sorted(v for _, _, v in ours.series if not math.isnan(v)) == \
            sorted(v for _, _, v in theirs if not math.isnan(v)), name


def _value(rng: random.Random) -> str:
    return rng.choice([repr(rng.uniform(-1e6, 1e6)), str(rng.randint(0, 10**9)), "NaN", "+Inf", "-Inf",
                       f"{rng.uniform(0, 1):.3e}"])


def _label_value(rng: random.Random) -> str:
    alphabet = 'abc XYZ0_-{},="\\\n/:é'
    raw = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    return raw.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def test_random_bodies_parse_like_prometheus_client() -> None:
    rng = random.Random(25)
    for _ in range(30):
        lines = []
        for i in range(rng.randint(1, 60)):
            name = rng.choice(["vllm:num_requests_running", "nv_inference_count", "x_y", f"m{i}_gauge"])
            labels = {f"l{j}": _label_value(rng) for j in range(rng.randint(0, 4))}
            body = ",".join(f'{k}="{v}"' for k, v in labels.items())
            ts = f" {rng.randint(1, 2**40)}" if rng.random() < 0.2 else ""
            lines.append(f"{name}{{{body}}} {_value(rng)}{ts}" if labels or rng.random() < 0.3 else
                         f"{name} {_value(rng)}{ts}")
            if rng.random() < 0.2:
                lines.append(f"# HELP {name} some help")
        text = "\n".join(lines) + "\n"
        ours = promtext.parse(text)
        assert ours.bad_lines == 0, ours.first_bad
        assert same(ours.series, reference(text)), text


def test_garbage_is_counted_not_raised() -> None:
    text = "<html>oops</html>\nvllm:num_requests_running{a=\"1\" 3\nvllm:kv_cache_usage_perc{} notanumber\n" \
           "vllm:num_requests_waiting 2\n"
    p = promtext.parse(text)
    assert p.bad_lines == 3
    assert p.series == [("vllm:num_requests_waiting", {}, 2.0)]


def test_filter_skips_unwanted_series_and_max_series_bounds_memory() -> None:
    text = "".join(f'other_metric{{i="{i}"}} {i}\n' for i in range(1000)) + "vllm:num_requests_waiting 7\n"
    p = promtext.parse(text, kinds.wanted)
    assert p.lines == 1001 and p.series == [("vllm:num_requests_waiting", {}, 7.0)]
    assert len(promtext.parse(text, max_series=10).series) == 10
