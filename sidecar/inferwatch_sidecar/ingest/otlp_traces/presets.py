"""What the spans of each engine mean, recognised from the spans themselves.

A preset decides, for a span it claims, its *role*: a ``REQUEST`` span
becomes one request event; a ``STAGE`` span gives stage timings to the
nearest request span above it in the same trace; an ``UNUSED`` span is
accepted and only remembered as a link in the trace's parent chain. The
preset then builds the request's model, version, outcome and stages.

- **triton**: scope ``triton-server`` or a ``triton.model_name`` attribute.
  The span named after the model (with ``triton.model_name`` and
  ``triton.model_version``) is the request; its ``compute`` child is a stage
  span; the ``InferRequest`` root is unused. Stages come from span events:
  queue ``QUEUE_START``..``COMPUTE_START``, preprocess
  ``COMPUTE_START``..``COMPUTE_INPUT_END``, inference
  ``COMPUTE_INPUT_END``..``COMPUTE_OUTPUT_START``, postprocess
  ``COMPUTE_OUTPUT_START``..``COMPUTE_END``: the same differences Triton's
  ``nv_inference_queue_duration_us`` and ``nv_inference_compute_*`` counters sum.
- **vllm**: a span named ``llm_request`` or one with ``gen_ai.latency.e2e``.
  The duration is ``gen_ai.latency.e2e``; stages queue, prefill and decode
  come from ``gen_ai.latency.time_in_queue``, ``.time_in_model_prefill`` and
  ``.time_in_model_decode``; the decode stage carries the stream (time to
  first token from ``gen_ai.latency.time_to_first_token``, tokens from
  ``gen_ai.usage.completion_tokens``). Model from ``gen_ai.response.model``
  or ``gen_ai.request.model`` on the span, else on its resource: vLLM 0.32's
  span names no model, so the vLLM process sets it with
  ``OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=<served model name>``.
- **generic**: any other SERVER span is a request (OpenTelemetry's HTTP
  server conventions: ``http.response.status_code`` >= 500 is an error of
  type ``http_<code>``, as the SDK's middleware reports it); a span with
  GenAI attributes (``gen_ai.operation.name``) that is not a server span is
  a stage named after its operation. Model from ``gen_ai.response.model`` or
  ``gen_ai.request.model``.

User configuration adds span-name -> stage mappings on top of any preset
and may name the attributes that carry the model and version.
"""

from __future__ import annotations

from typing import Any

from inferwatch.wire import OUTCOME_ERROR, OUTCOME_OK, outcome_of_status
from inferwatch_sidecar.ingest.otlp_traces.decode import SPAN_KIND_SERVER, STATUS_ERROR, Span, finite_seconds

REQUEST = 0
STAGE = 1
UNUSED = 2

#: A stage tuple as the wire format has it: (name, duration_ns, stream or None).
Stage = tuple[str, int, Any]


def _error(span: Span) -> tuple[int, str | None]:
    """Outcome and error type from the span status and the HTTP status code."""
    code = span.attrs.get("http.response.status_code", span.attrs.get("http.status_code"))
    if isinstance(code, int) and not isinstance(code, bool) and code >= 400:
        outcome = outcome_of_status(code)  # 429/503 shed, another 4xx client_error, another 5xx error
        if outcome == OUTCOME_ERROR:
            return OUTCOME_ERROR, f"http_{code}" if code < 600 else "http_5xx"
        return outcome, None
    if span.status == STATUS_ERROR:
        et = span.attrs.get("error.type")
        if not isinstance(et, str):
            et = next((str(a.get("exception.type")) for n, _, a in span.events
                       if n == "exception" and a.get("exception.type")), "span_error")
        return OUTCOME_ERROR, et[:64]
    return OUTCOME_OK, None


def _text(v: Any) -> str | None:
    if v is None or isinstance(v, tuple):
        return None
    return str(v)


class Preset:
    """The interface every preset implements (the generic preset is the base)."""

    name = "generic"
    #: Span attributes that become drift features when ``traces.features`` is not set.
    default_features: tuple[str, ...] = (
        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.request.max_tokens",
        "gen_ai.request.temperature", "gen_ai.response.finish_reasons",
    )

    def claims(self, span: Span) -> bool:
        return True

    def role(self, span: Span) -> int:
        if span.kind == SPAN_KIND_SERVER:
            return REQUEST
        if isinstance(span.attrs.get("gen_ai.operation.name"), str):
            return STAGE
        return UNUSED

    def model(self, span: Span) -> tuple[str | None, str | None]:
        return _text(span.attrs.get("gen_ai.response.model") or span.attrs.get("gen_ai.request.model")), None

    def outcome(self, span: Span) -> tuple[int, str | None]:
        return _error(span)

    def duration(self, span: Span) -> int:
        return span.end - span.start

    def stages(self, span: Span, children: list[Span]) -> list[Stage]:
        """Stages from the request span and its preset STAGE children (user-mapped ones are added by the mapper)."""
        return [(str(c.attrs["gen_ai.operation.name"]), c.end - c.start, None) for c in children
                if isinstance(c.attrs.get("gen_ai.operation.name"), str)]


class TritonPreset(Preset):
    name = "triton"
    default_features = ()

    def claims(self, span: Span) -> bool:
        return span.res.scope == "triton-server" or "triton.model_name" in span.attrs

    def role(self, span: Span) -> int:
        if "triton.model_name" in span.attrs:
            return REQUEST
        if span.name == "compute":
            return STAGE
        return UNUSED

    def model(self, span: Span) -> tuple[str | None, str | None]:
        return _text(span.attrs.get("triton.model_name")), _text(span.attrs.get("triton.model_version"))

    def stages(self, span: Span, children: list[Span]) -> list[Stage]:
        queue_start = span.event_time("QUEUE_START")
        out: list[Stage] = []
        for c in children:
            if c.name != "compute":
                continue
            t = {n: ts for n, ts, _ in c.events}
            marks = [
                ("queue", queue_start, t.get("COMPUTE_START")),
                ("preprocess", t.get("COMPUTE_START"), t.get("COMPUTE_INPUT_END")),
                ("inference", t.get("COMPUTE_INPUT_END"), t.get("COMPUTE_OUTPUT_START")),
                ("postprocess", t.get("COMPUTE_OUTPUT_START"), t.get("COMPUTE_END")),
            ]
            out += [(name, b - a, None) for name, a, b in marks if a is not None and b is not None and b >= a]
            break  # one compute span per model request
        return out


class VllmPreset(Preset):
    name = "vllm"
    default_features = (
        "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.request.max_tokens",
        "gen_ai.request.temperature", "gen_ai.request.top_p", "gen_ai.request.n",
    )

    def claims(self, span: Span) -> bool:
        return span.name == "llm_request" or "gen_ai.latency.e2e" in span.attrs

    def role(self, span: Span) -> int:
        return REQUEST

    def model(self, span: Span) -> tuple[str | None, str | None]:
        return _text(span.attr("gen_ai.response.model") or span.attr("gen_ai.request.model")), None

    def duration(self, span: Span) -> int:
        e2e = finite_seconds(span.attrs.get("gen_ai.latency.e2e"))
        return span.end - span.start if e2e is None else round(e2e * 1e9)

    def stages(self, span: Span, children: list[Span]) -> list[Stage]:
        a = span.attrs
        out: list[Stage] = []
        for stage, key in (("queue", "gen_ai.latency.time_in_queue"), ("prefill", "gen_ai.latency.time_in_model_prefill")):
            s = finite_seconds(a.get(key))
            if s is not None:
                out.append((stage, round(s * 1e9), None))
        decode = finite_seconds(a.get("gen_ai.latency.time_in_model_decode"))
        if decode is not None:
            ttft = finite_seconds(a.get("gen_ai.latency.time_to_first_token"))
            tokens = a.get("gen_ai.usage.completion_tokens")
            stream = None
            if ttft is not None and isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
                stream = (round(ttft * 1e9), min(tokens, 0xFFFFFFFF), ())
            out.append(("decode", round(decode * 1e9), stream))
        return out


#: Every preset by name, in the order spans are offered to them (generic claims the rest).
PRESETS: dict[str, Preset] = {p.name: p for p in (TritonPreset(), VllmPreset(), Preset())}
