"""The public surface: __all__, import cost, configuration and the no-op mode."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

import inferwatch
from inferwatch import _core, _env, _scope, _stages
from inferwatch.wire import EV_BATCH, EV_QUEUE, EV_RECORD, EV_REQUEST, EV_STAGE
from tests.sdk.conftest import FakeClock, Receiver, buffered


def test_every_name_in_all_resolves() -> None:
    for name in inferwatch.__all__:
        assert getattr(inferwatch, name) is not None, name
    assert len(set(inferwatch.__all__)) == len(inferwatch.__all__)
    assert set(inferwatch.__all__) <= set(dir(inferwatch))


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError):
        inferwatch.does_not_exist  # noqa: B018


def test_import_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, json, time; t = time.perf_counter(); import inferwatch; "
        "dt = time.perf_counter() - t; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('numpy', 'scipy', 'prometheus_client', 'asyncio', 'torch', 'pydantic', 'yaml') "
        "or m.startswith('opentelemetry.sdk')); "
        "codecs = sorted(m for m in sys.modules if m.startswith('inferwatch.wire.') and m != 'inferwatch.wire.spec'); "
        "print(json.dumps({'heavy': heavy, 'codecs': codecs, 'ms': dt * 1e3}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    assert result["heavy"] == []
    # The wire codecs load lazily: the encoder with configure(), the decoder (the sidecar's half) never here.
    assert result["codecs"] == []
    # The time is printed, not asserted: timing targets live in bench/sdk_overhead.py.
    print(f"import inferwatch: {result['ms']:.1f} ms")


def test_configure_without_opentelemetry_sdk_still_loads_none() -> None:
    code = (
        "import sys, inferwatch; inferwatch.configure(sidecar='udp://127.0.0.1:9'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'scipy', 'prometheus_client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_api_is_a_noop_before_configure() -> None:
    assert not inferwatch.is_configured()

    @inferwatch.stage("inference")
    def f(x: int) -> int:
        return x + 1

    with inferwatch.request("abc") as req:
        assert req.request_id is None
        assert inferwatch.current_request_id() is None
        assert f(1) == 2
        with inferwatch.stage("post"):
            pass
        inferwatch.record(prediction=1, confidence=0.5, features={"a": 1.0})
    inferwatch.observe_batch(4)
    inferwatch.set_queue_depth(3)
    assert inferwatch.flush() is True
    assert inferwatch.stats() == {}
    assert _core._rt is None


def test_decorators_applied_before_configure_start_emitting_after(receiver: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("inference")
    def f() -> None:
        clock.advance(7)

    f()
    inferwatch.configure(sidecar=receiver.path, flush_interval_ms=10_000, clock=clock)
    f()
    evs = buffered()
    assert [(e[0], e[4][:2]) for e in evs] == [(EV_STAGE, ("inference", 7))]


def test_configure_twice_warns_and_keeps_the_first(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    assert inferwatch.configure(service="first", sidecar=receiver.path)
    with caplog.at_level(logging.WARNING, logger="inferwatch"):
        assert inferwatch.configure(service="second", sidecar=receiver.path) is False
    assert "called again" in caplog.text
    assert _core._rt is not None and _core._rt.ctx[0] == "first"


def test_shutdown_then_configure_again(receiver: Receiver) -> None:
    assert inferwatch.configure(service="a", sidecar=receiver.path)
    inferwatch.shutdown()
    assert not inferwatch.is_configured()
    assert inferwatch.configure(service="b", sidecar=receiver.path)
    assert _core._rt is not None and _core._rt.ctx[0] == "b"


def test_every_hot_path_module_sees_the_same_runtime(receiver: Receiver) -> None:
    # _scope and _stages keep their own copy of the runtime (one global lookup on the hot path).
    assert _core._rt is None and _scope._rt is None and _stages._rt is None
    assert inferwatch.configure(service="a", sidecar=receiver.path)
    assert _core._rt is not None and _scope._rt is _core._rt and _stages._rt is _core._rt
    with inferwatch.request("r1"), inferwatch.stage("inference"):
        assert inferwatch.current_request_id() == "r1"
    inferwatch.shutdown()
    assert _core._rt is None and _scope._rt is None and _stages._rt is None


def test_configure_reads_environment_variables(receiver: Receiver) -> None:
    env = {
        "INFERWATCH_SERVICE": "ranker",
        "INFERWATCH_MODEL": "resnet",
        "INFERWATCH_MODEL_VERSION": "v3",
        "INFERWATCH_SIDECAR": f"unix://{receiver.path}",
        "INFERWATCH_BUFFER_SIZE": "1000",
        "INFERWATCH_FLUSH_INTERVAL_MS": "20",
    }
    assert inferwatch.configure(env=env)
    rt = _core._rt
    assert rt is not None
    assert rt.ctx == ("ranker", "resnet", "v3")
    assert rt.cap == 1000
    assert rt.sender.flush_s == pytest.approx(0.02)
    assert str(rt.sender.address) == f"unix://{receiver.path}"


def test_arguments_win_over_environment(receiver: Receiver) -> None:
    assert inferwatch.configure(service="arg", sidecar=receiver.path, env={"INFERWATCH_SERVICE": "env"})
    assert _core._rt is not None and _core._rt.ctx[0] == "arg"


def test_disabled_by_argument_or_environment_is_a_noop(receiver: Receiver) -> None:
    assert inferwatch.configure(enabled=False, sidecar=receiver.path) is False
    assert not inferwatch.is_configured()
    assert inferwatch.configure(env={"INFERWATCH_ENABLED": "false"}) is False
    assert not inferwatch.is_configured()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env": {"INFERWATCH_BUFFER_SIZE": "lots"}}, "INFERWATCH_BUFFER_SIZE='lots': expected an integer"),
        ({"env": {"INFERWATCH_ENABLED": "maybe"}}, "INFERWATCH_ENABLED='maybe': expected true or false"),
        ({"env": {"INFERWATCH_SIDECAR": "tcp://x:1"}}, "INFERWATCH_SIDECAR='tcp://x:1': expected unix://"),
        ({"env": {"INFERWATCH_FLUSH_INTERVAL_MS": "nan"}}, "INFERWATCH_FLUSH_INTERVAL_MS='nan'"),
        ({"sidecar": "unix://relative/path"}, "must be absolute"),
        ({"sidecar": "udp://127.0.0.1:99999"}, "port out of range"),
        ({"sidecar": "udp://127.0.0.1"}, "expected unix://"),
        ({"buffer_size": 3}, "buffer_size=3"),
        ({"service": ""}, "service=''"),
        ({"flush_interval_ms": -1}, "flush_interval_ms=-1"),
    ],
)
def test_bad_configuration_raises_a_message_that_names_it(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("?", r"\?")):
        inferwatch.configure(**kwargs)  # type: ignore[arg-type]
    assert not inferwatch.is_configured()


def test_address_forms() -> None:
    assert _env.parse_address("unix:///tmp/x.sock") == ("unix", "/tmp/x.sock")
    assert _env.parse_address("/tmp/x.sock") == ("unix", "/tmp/x.sock")
    assert _env.parse_address("udp://127.0.0.1:9125") == ("udp", ("127.0.0.1", 9125))
    assert _env.parse_address("udp://[::1]:9125") == ("udp", ("::1", 9125))
    assert str(_env.parse_address("udp://[::1]:9125")) == "udp://[::1]:9125"
    assert _env.DEFAULT_SOCKET == "/tmp/inferwatch/ingest.sock"
    assert _env.DEFAULT_SIDECAR == "unix:///tmp/inferwatch/ingest.sock"
    assert inferwatch.DEFAULT_SOCKET == _env.DEFAULT_SOCKET


def test_every_environment_variable_is_documented_in_env_module() -> None:
    import pathlib
    import re

    sdk_dir = pathlib.Path(inferwatch.__file__).parent
    used = set()
    for path in sdk_dir.glob("*.py"):
        used |= set(re.findall(r"INFERWATCH_[A-Z_]+", path.read_text()))
    assert used == set(_env.ENV_VARS)
    doc = _env.__doc__ or ""
    for name in _env.ENV_VARS:
        assert f"``{name}``" in doc


@pytest.mark.parametrize("bad", ["", "has space", "1starts_with_digit", "x" * 65, "semi;colon", "é"])
def test_bad_stage_name_raises_at_definition(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid stage name"):
        inferwatch.stage(bad)(lambda: None)


@pytest.mark.parametrize("bad", [None, 3, b"bytes", ["x"]])
def test_non_string_stage_name_raises_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="stage name must be a str"):
        inferwatch.stage(bad)(lambda: None)  # type: ignore[arg-type]


def test_stage_decorating_a_non_callable_raises() -> None:
    with pytest.raises(TypeError, match="decorates a callable"):
        inferwatch.stage("x")(42)  # type: ignore[type-var]


def test_observe_batch_and_queue_depth_events(sdk: Receiver) -> None:
    inferwatch.observe_batch(8)
    inferwatch.set_queue_depth(3)
    with inferwatch.request(model="other"):
        inferwatch.observe_batch(2)
    evs = buffered()
    assert evs[0] == (EV_BATCH, ("svc", "m", "v1"), 8)
    assert evs[1] == (EV_QUEUE, ("svc", "m", "v1"), 3)
    assert evs[2] == (EV_BATCH, ("svc", "other", "v1"), 2)
    assert evs[3][0] == EV_REQUEST
    inferwatch.observe_batch(5)
    inferwatch.set_queue_depth(0)
    assert inferwatch.flush()
    recs = sdk.records()
    assert (EV_BATCH, ("svc", "m", "v1"), 5) in recs
    assert (EV_QUEUE, ("svc", "m", "v1"), 0) in recs


def test_record_outside_a_request_has_no_request_id(sdk: Receiver) -> None:
    inferwatch.record(prediction="cat", confidence=0.75)
    (ev,) = buffered()
    assert ev[0] == EV_RECORD and ev[3] is None and ev[4] == "cat" and ev[5] == 0.75


def test_record_extra_keywords_are_features(sdk: Receiver) -> None:
    with inferwatch.request("r1"):
        inferwatch.record(prediction=1.0, features={"a": 1.0}, b=2.0)
        inferwatch.record(prediction=1.0, c="x")
    evs = buffered()
    assert evs[0][7] == {"a": 1.0, "b": 2.0}
    assert evs[1][7] == {"c": "x"}
    assert evs[0][3] == "r1"
