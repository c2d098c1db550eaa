"""The pipeline sums a frame's byte estimate once and hands it to every staged component: the same sum
each stage would have made (``Staging.put`` without ``nbytes``), so what is staged and refused is unchanged."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.wire import EV_HELLO, EV_HTTP, EV_RECORD, EV_REQUEST, Encoder
from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.staging import Staging, record_bytes
from inferwatch_sidecar.ingest.pipeline import Pipeline

CTX = ("svc", "m", "v1")
_feats = st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b", "c", "d"]),
                                              st.one_of(st.floats(allow_nan=False), st.text(max_size=8)), max_size=4))
_event = st.one_of(
    st.builds(lambda i, f: (EV_RECORD, CTX, i, f"r{i}", "cat", 0.5, None, f), st.integers(0, 10**6), _feats),
    st.builds(lambda i: (EV_RECORD, CTX, i, f"r{i}", None, None, "label", None), st.integers(0, 10**6)),
    st.builds(lambda i: (EV_REQUEST, CTX, i, 5, 0, None, f"r{i}", None, [("pre", 1, None)]), st.integers(0, 10**6)),
    st.builds(lambda i: (EV_HTTP, CTX, i, "/p", 200, 0, 0, 0, False, None), st.integers(0, 10**6)),
    st.just((EV_HELLO, "0.1", "python", "h", 1)),
)


class Probe:
    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], int | None]] = []

    def handle(self, pid: int, producer_id: int, records: list[Any], nbytes: int | None = None) -> None:
        self.calls.append((list(records), nbytes))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event, min_size=1, max_size=30))
def test_each_staged_component_gets_the_sum_its_stage_would_make(events: list[Any]) -> None:
    p = Pipeline(Aggregator(ComponentContext()))
    probes = {name: Probe() for name in ("records", "requests_records", "requests_hello", "http", "unsized")}
    p.subscribe("records", frozenset({EV_RECORD}), probes["records"].handle, sized=True)
    p.subscribe("requests_records", frozenset({EV_REQUEST, EV_RECORD}), probes["requests_records"].handle, sized=True)
    p.subscribe("requests_hello", frozenset({EV_REQUEST, EV_HELLO}), probes["requests_hello"].handle, sized=True)
    p.subscribe("http", frozenset({EV_HTTP, EV_RECORD}), probes["http"].handle, sized=True)
    p.subscribe("unsized", frozenset({EV_RECORD}), probes["unsized"].handle)
    for frame in Encoder(1, 2).encode(events):
        p.datagram(frame, "unix")
    for name, probe in probes.items():
        for records, nbytes in probe.calls:
            if name == "unsized":
                assert nbytes is None
            elif nbytes is not None:
                assert nbytes == sum(record_bytes(r) for r in records), name
    # The components that take every RECORD, or all of a frame, are handed the sum (what this is for).
    assert all(nb is not None for _, nb in probes["records"].calls)


def test_a_stage_given_the_sum_stages_and_refuses_what_it_would_have() -> None:
    feats = {"a": 1.0, "b": "x" * 10}
    events = [(EV_RECORD, CTX, i, f"r{i}", "cat", 0.5, None, feats) for i in range(50)]
    recs = [r for f in Encoder(1, 2).encode(events) for r in _decode(f)]
    total = sum(record_bytes(r) for r in recs)
    for budget in (total, total - 1, total // 2, 10):
        a, b = Staging(1000, budget), Staging(1000, budget)
        assert a.put(recs) == b.put(recs, total)
        assert a.take() == b.take()


def _decode(frame: bytes) -> list[Any]:
    from inferwatch.wire import Decoder

    return Decoder().decode(frame).records
