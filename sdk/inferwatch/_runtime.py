"""The SDK's lifecycle: ``configure()``, ``flush()``, ``shutdown()``, ``stats()``, and what a fork does.

The sender thread and the runtime state it shares with the hot path live in ``_sender``; their names are
importable from here too.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from inferwatch import _core
from inferwatch._env import (
    DEFAULT_SIDECAR,
    env_bool,
    env_float,
    env_int,
    env_str,
    parse_address,
)
from inferwatch._sender import (
    _EAGAIN_BACKOFF_S,
    _ENCODE_CHUNK,
    WARN_INTERVAL_S,
    Runtime,
    Sender,
    Settings,
    _process_start_ns,
    _RateLimitedLog,
    logger,
)
from inferwatch._torch import StatsSource
from inferwatch._version import __version__

__all__ = [
    "WARN_INTERVAL_S", "Runtime", "Sender", "Settings", "_EAGAIN_BACKOFF_S", "_ENCODE_CHUNK", "_RateLimitedLog",
    "_process_start_ns", "configure", "flush", "is_configured", "logger", "shutdown", "stats",
]

# -- public lifecycle -------------------------------------------------------------------------

_lock = threading.Lock()
_atexit_registered = False


def _make_tracer(enabled: bool, provider: Any = None) -> Any:
    if not enabled:
        return None
    if provider is not None:
        return provider.get_tracer("inferwatch", __version__)
    try:
        from opentelemetry import trace
    except ImportError:
        logger.warning(
            "inferwatch: otel_spans is on but opentelemetry-api is not installed; "
            'stage spans are off (pip install "inferwatch[otel]")'
        )
        return None
    return trace.get_tracer("inferwatch", __version__)


def _opt_str(value: object, name: str, env_name: str, default: str | None, env: Mapping[str, str] | None) -> str | None:
    if value is None:
        value = env_str(env_name, env)
    if value is None:
        return default
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value or len(value.encode("utf-8")) > 255:
        raise ValueError(f"{name}={value!r}: expected 1 to 255 bytes")
    return value


def configure(
    service: str | None = None,
    model: str | None = None,
    model_version: str | None = None,
    sidecar: str | None = None,
    enabled: bool | None = None,
    *,
    buffer_size: int | None = None,
    flush_interval_ms: float | None = None,
    hello_interval_s: float | None = None,
    schema_repeat_s: float | None = None,
    otel_spans: bool | None = None,
    torch_probe: bool | None = None,
    torch_probe_interval_s: float | None = None,
    torch_stats_source: StatsSource | None = None,
    otel_tracer_provider: Any = None,
    clock: Callable[[], int] | None = None,
    env: Mapping[str, str] | None = None,
) -> bool:
    """Turn the SDK on. Until this is called every API is a cheap no-op.

    Every argument left as None falls back to its ``INFERWATCH_*``
    environment variable (see ``inferwatch._env``), then to the default.
    Calling it again while configured logs a warning and changes nothing;
    call :func:`shutdown` first to reconfigure.

    Args:
        service: service name sent with every event.
        model: default model name.
        model_version: default model version.
        sidecar: ``unix:///path`` (the default is
            ``unix:///tmp/inferwatch/ingest.sock``), a bare absolute path, or
            ``udp://127.0.0.1:PORT``.
        enabled: False leaves the SDK off (a no-op), as does
            ``INFERWATCH_ENABLED=false``.
        buffer_size: events buffered before new ones are dropped.
        flush_interval_ms: how often the sender thread drains the buffer
            (default 50; it also wakes when the buffer is half full). Shorter
            intervals mean smaller batches and more wake-ups, which cost the
            serving threads more CPU and GIL time.
        hello_interval_s: how often HELLO and drop counts are sent when idle.
        schema_repeat_s: re-announce each feature schema this often.
        otel_spans: also open an OpenTelemetry span per stage.
        torch_probe: sample ``torch.cuda.memory_stats()`` in the background.
        torch_probe_interval_s: seconds between allocator samples.
        torch_stats_source: a callable returning ``{device: memory_stats}``
            to use instead of torch (for tests and custom allocators).
        otel_tracer_provider: the TracerProvider for stage spans (default:
            the global one from ``opentelemetry.trace``).
        clock: monotonic nanoseconds, for tests (default ``time.perf_counter_ns``).
        env: a mapping to read variables from instead of ``os.environ``.

    Returns:
        True when the SDK is now sending events, False when it is disabled
        or was already configured.

    Raises:
        ValueError, TypeError: an argument or variable is malformed; the
            message names it and says what is expected.
    """
    global _atexit_registered
    if enabled is None:
        enabled = env_bool("INFERWATCH_ENABLED", True, env)
    if sidecar is None:
        sidecar = env_str("INFERWATCH_SIDECAR", env)
        address = parse_address(sidecar, "INFERWATCH_SIDECAR") if sidecar else parse_address(DEFAULT_SIDECAR)
    else:
        address = parse_address(sidecar, "sidecar")

    def num(value: float | None, name: str, env_name: str, default: float, lo: float, hi: float) -> float:
        if value is None:
            return env_float(env_name, default, lo, hi, env)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise ValueError(f"{name}={value!r}: expected a number between {lo} and {hi}")
        return float(value)

    if buffer_size is None:
        buffer_size = env_int("INFERWATCH_BUFFER_SIZE", 16384, 16, 10_000_000, env)
    elif isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or not 16 <= buffer_size <= 10_000_000:
        raise ValueError(f"buffer_size={buffer_size!r}: expected an integer between 16 and 10000000")
    if clock is not None and not callable(clock):
        raise TypeError("clock must be a callable returning nanoseconds")
    if torch_stats_source is not None and not callable(torch_stats_source):
        raise TypeError("torch_stats_source must be a callable returning {device: memory_stats}")
    settings = Settings(
        service=_opt_str(service, "service", "INFERWATCH_SERVICE", "unknown_service", env),
        model=_opt_str(model, "model", "INFERWATCH_MODEL", None, env),
        model_version=_opt_str(model_version, "model_version", "INFERWATCH_MODEL_VERSION", None, env),
        address=address,
        buffer_size=buffer_size,
        flush_interval_s=num(flush_interval_ms, "flush_interval_ms", "INFERWATCH_FLUSH_INTERVAL_MS", 50, 0.1, 10_000)
        / 1000.0,
        hello_interval_s=num(hello_interval_s, "hello_interval_s", "INFERWATCH_HELLO_INTERVAL_S", 10, 0.01, 3600),
        schema_repeat_s=num(schema_repeat_s, "schema_repeat_s", "INFERWATCH_SCHEMA_REPEAT_S", 2, 0.0, 3600),
        otel_spans=bool(otel_spans) if otel_spans is not None else env_bool("INFERWATCH_OTEL_SPANS", False, env),
        torch_probe=bool(torch_probe) if torch_probe is not None else env_bool("INFERWATCH_TORCH_PROBE", False, env),
        torch_probe_interval_s=num(
            torch_probe_interval_s, "torch_probe_interval_s", "INFERWATCH_TORCH_PROBE_INTERVAL_S", 10, 0.01, 86400
        ),
        torch_stats_source=torch_stats_source,
        clock=clock or time.perf_counter_ns,
        otel_tracer_provider=otel_tracer_provider,
    )
    with _lock:
        if _core._rt is not None:
            logger.warning(
                "inferwatch.configure() called again; keeping the first configuration (call shutdown() first)"
            )
            return False
        if not enabled:
            logger.info("inferwatch: disabled (enabled=False or INFERWATCH_ENABLED=false)")
            return False
        _start(settings)
        if not _atexit_registered:
            atexit.register(_atexit)
            _atexit_registered = True
    return True


def _start(settings: Settings) -> Runtime:
    rt = Runtime(settings, _make_tracer(settings.otel_spans, settings.otel_tracer_provider))
    rt.sender.start()
    _core._set_runtime(rt)
    return rt


def is_configured() -> bool:
    """True while the SDK is configured and sending."""
    return _core._rt is not None


def flush(timeout: float = 2.0) -> bool:
    """Send everything buffered now, from the calling thread.

    Args:
        timeout: seconds to wait for the sender thread if it is busy.

    Returns:
        True when the buffer was drained and every frame was sent.
    """
    rt = _core._rt
    if rt is None:
        return True
    s = rt.sender
    if threading.current_thread() is s.thread:
        return False
    if not s.cycle(timeout=timeout):
        return False
    # Encoding may have found bad values: a second pass reports those drop counts now.
    s.cycle(timeout=timeout)
    return not rt.buf and s.delivered()


def shutdown(timeout: float = 2.0) -> bool:
    """Flush, stop the sender thread and turn the SDK off (a no-op again).

    Args:
        timeout: seconds to wait for the final flush and the thread, all together (one deadline:
            waiting for the thread, then for its lock, used to take up to twice this).

    Returns:
        The result of the final :func:`flush`.
    """
    deadline = time.monotonic() + max(0.0, timeout)
    with _lock:
        rt = _core._rt
        if rt is None:
            return True
        _core._set_runtime(None)
    s = rt.sender
    s.stopping.set()
    rt.wake.set()
    if s.thread.is_alive() and threading.current_thread() is not s.thread:
        s.thread.join(max(0.0, deadline - time.monotonic()))
    ok = False
    if s.cycle(timeout=max(0.0, deadline - time.monotonic())):
        s.cycle(timeout=max(0.0, deadline - time.monotonic()))  # the drop counts the last encode found
        ok = not rt.buf and s.delivered()
    s.close()
    return ok


def stats() -> dict[str, Any]:
    """Counters of this process's sender, for debugging and tests.

    Returns:
        ``sent_frames``, ``sent_events``, ``buffered``, ``drops`` (by reason),
        ``producer_id``, ``pid`` and ``address``; ``{}`` when not configured.
    """
    rt = _core._rt
    if rt is None:
        return {}
    s = rt.sender
    return {
        "sent_frames": s.sent_frames,
        "sent_events": s.sent_events,
        "buffered": len(rt.buf),
        "drops": s.drops(),
        "internal_errors": rt.internal_errors,
        "producer_id": s.producer_id,
        "pid": s.pid,
        "address": str(s.address),
    }


def _atexit() -> None:
    try:
        shutdown(timeout=1.0)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    """Give a forked child its own buffer, encoder (new producer ID) and sender thread."""
    global _lock
    _lock = threading.Lock()  # the parent may have held it while forking
    rt = _core._rt
    if rt is None:
        return
    _core._set_runtime(None)
    try:
        old = rt.sender
        if old.sock is not None:
            try:
                old.sock.close()
            except OSError:
                pass
        _start(rt.settings)
    except Exception as e:  # a child without telemetry is better than a child that crashes
        print(f"inferwatch: could not restart the sender after fork: {e}", file=sys.stderr)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
