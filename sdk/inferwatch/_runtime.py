"""Configuration, the background sender, flush/shutdown and fork handling.

The hot path (``_core``) only appends event tuples to ``Runtime.buf``. The
sender thread wakes every flush interval (50 ms by default, or early when the
buffer passes its high-water mark), drains the buffer, encodes the events into
frames with ``inferwatch.wire.Encoder`` and sends each frame as one non-blocking
datagram. It shares the GIL with the serving code, so it wakes rarely and
encodes big batches (each encode call has a fixed cost, each wake-up a thread
switch), and it encodes a large batch in chunks, letting the GIL go between
them, so the event loop is never held up for long. It never
raises: every failure is counted by reason, reported to the sidecar in a
DROPS record (the counts since the last one that went out), and logged with a rate-limited warning.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from inferwatch import _core
from inferwatch._env import (
    DEFAULT_SIDECAR,
    Address,
    env_bool,
    env_float,
    env_int,
    env_str,
    parse_address,
    socket_dir_problem,
)
from inferwatch._torch import AllocatorProbe, StatsSource
from inferwatch._version import __version__
from inferwatch.wire import EV_DROPS, EV_HELLO, Encoder

logger = logging.getLogger("inferwatch")

#: Waits before retrying a frame the receiver had no room for (about 30 ms in all); then it is dropped.
_EAGAIN_BACKOFF_S: tuple[float | None, ...] = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, None)

#: Events encoded per call before the sender lets the GIL go: bounds how long the
#: serving threads wait on it (about 256 x 2 us of request runs on a slow core, well
#: under the interpreter's 5 ms switch interval) while spreading each call's fixed
#: cost (a frame, its string table, the first request of each run) over many events.
_ENCODE_CHUNK = 256

#: Seconds between two warnings with the same key.
WARN_INTERVAL_S = 60.0


class _RateLimitedLog:
    """Log a warning per key at most once per interval, with a count of the suppressed ones."""

    def __init__(self, interval_s: float = WARN_INTERVAL_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval_s
        self.monotonic = monotonic
        self.last: dict[str, float] = {}
        self.suppressed: dict[str, int] = {}

    def warn(self, key: str, msg: str, *args: Any) -> None:
        now = self.monotonic()
        last = self.last.get(key)
        if last is not None and now - last < self.interval:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
            return
        self.last[key] = now
        n = self.suppressed.pop(key, 0)
        if n:
            msg += f" ({n} similar warnings suppressed)"
        logger.warning(msg, *args)


class Settings:
    """The validated configuration, kept so a forked child can rebuild its runtime."""

    __slots__ = (
        "service", "model", "model_version", "address", "buffer_size", "flush_interval_s", "hello_interval_s",
        "schema_repeat_s", "otel_spans", "torch_probe", "torch_probe_interval_s", "torch_stats_source", "clock",
        "otel_tracer_provider",
    )

    def __init__(
        self,
        *,
        service: str | None,
        model: str | None,
        model_version: str | None,
        address: Address,
        buffer_size: int,
        flush_interval_s: float,
        hello_interval_s: float,
        schema_repeat_s: float,
        otel_spans: bool,
        torch_probe: bool,
        torch_probe_interval_s: float,
        torch_stats_source: StatsSource | None,
        clock: Callable[[], int],
        otel_tracer_provider: Any = None,
    ) -> None:
        self.service = service
        self.model = model
        self.model_version = model_version
        self.address = address
        self.buffer_size = buffer_size
        self.flush_interval_s = flush_interval_s
        self.hello_interval_s = hello_interval_s
        self.schema_repeat_s = schema_repeat_s
        self.otel_spans = otel_spans
        self.torch_probe = torch_probe
        self.torch_probe_interval_s = torch_probe_interval_s
        self.torch_stats_source = torch_stats_source
        self.clock = clock
        self.otel_tracer_provider = otel_tracer_provider


def _process_start_ns() -> int:
    """Process start time in Unix ns (Linux /proc), or now when unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 overall; index shifted by the 2 fields before ')'
        hz = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return int((int(line.split()[1]) + ticks / hz) * 1e9)
    except Exception:
        pass
    return time.time_ns()


class Runtime:
    """Everything the hot path needs, in slots for fast attribute access."""

    __slots__ = (
        "settings", "ctx", "clock", "offset", "buf", "cap", "high_water", "wake", "buffer_full",
        "internal_errors", "bad_names", "tracer", "sender",
    )

    def __init__(self, settings: Settings, tracer: Any) -> None:
        self.settings = settings
        self.ctx: tuple[str | None, str | None, str | None] = (settings.service, settings.model, settings.model_version)
        self.clock: Callable[[], int] = settings.clock
        # Event times are the monotonic clock plus this offset: one clock read per boundary.
        self.offset = time.time_ns() - self.clock()
        self.buf: deque[tuple[Any, ...]] = deque()
        self.cap: int = settings.buffer_size
        # Wake the sender early when the buffer is half full, so bursts do not overflow it.
        self.high_water: int = max(1, settings.buffer_size // 2)
        self.wake = threading.Event()
        self.buffer_full = 0
        self.internal_errors = 0
        #: ``with stage(name)`` blocks entered with a bad name (reported as ``bad_name`` drops).
        self.bad_names = 0
        self.tracer = tracer
        self.sender = Sender(self)


class Sender:
    """Drains the runtime's buffer and sends frames; one per process.

    Args:
        rt: the runtime whose buffer this sender drains.
    """

    def __init__(self, rt: Runtime) -> None:
        s = rt.settings
        self.rt = rt
        self.address: Address = s.address
        self.flush_s: float = s.flush_interval_s
        self.hello_s: float = s.hello_interval_s
        self.pid = os.getpid()
        self.producer_id = int.from_bytes(os.urandom(8), "little")
        self.encoder = Encoder(self.pid, self.producer_id, schema_repeat_s=s.schema_repeat_s)
        self.hello = (EV_HELLO, __version__, "python", socket.gethostname()[:255], _process_start_ns())
        self.probe: AllocatorProbe | None = (
            AllocatorProbe(s.torch_probe_interval_s, s.torch_stats_source) if s.torch_probe else None
        )
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.log = _RateLimitedLog()
        #: Cumulative counts of events lost on the way out, by reason.
        self.counts = {"socket_absent": 0, "send_failed": 0, "socket_untrusted": 0}
        self.sent_frames = 0
        self.sent_events = 0
        self.healthy = False
        #: Set by the first events: until then the process sends nothing, not even HELLO, so a
        #: process that configures and never records (a ``gunicorn --preload`` master) is no producer.
        self.active = False
        self.need_hello = True
        self.recheck = False
        #: Cumulative drop counts as of the last DROPS record that went out: a DROPS
        #: record carries the increments since, so a restarted sidecar counts nothing twice.
        self.last_drops: dict[str, int] = {}
        #: Whether the first frame of the last send (the one carrying HELLO and DROPS) went out.
        self.head_sent = False
        self.next_hello = 0.0
        self.sock: socket.socket | None = None
        self.thread = threading.Thread(target=self._run, name="inferwatch-sender", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        wake = self.rt.wake
        while not self.stopping.is_set():
            wake.wait(self.flush_s)
            wake.clear()
            if self.stopping.is_set():
                break
            if _core._inflight:
                _core._sweep_disconnects(self.rt)
            self.cycle()

    def cycle(self, timeout: float = -1) -> bool:
        """Drain, encode and send once. Returns False when the lock was not acquired."""
        if not self.lock.acquire(timeout=timeout):
            return False
        try:
            self._cycle()
        except Exception as e:  # never let the sender thread die
            self.rt.internal_errors += 1
            self.log.warn("internal", "inferwatch: sender error %s: %s", type(e).__name__, e)
        finally:
            self.lock.release()
        return True

    def delivered(self) -> bool:
        """True when everything this process produced has gone out (vacuously, before its first event)."""
        return self.healthy or not self.active

    def drops(self) -> dict[str, int]:
        """Cumulative drop counts by reason: buffer, transport and encoder."""
        d = {"buffer_full": self.rt.buffer_full, "bad_name": self.rt.bad_names, **self.counts}
        for k, v in self.encoder.drops.items():
            d[k] = d.get(k, 0) + v
        return {k: v for k, v in d.items() if v}

    def _cycle(self) -> None:
        now = time.monotonic()
        buf = self.rt.buf
        probe = self.probe
        if not buf and not self.recheck and now < self.next_hello and (probe is None or now < probe.next_due):
            return  # idle: the common case for a quiet process, kept to a few attribute reads
        self.recheck = False
        popleft = buf.popleft
        events = [popleft() for _ in range(len(buf))]
        if probe is not None and probe.due(now):
            samples = probe.sample()
            events.extend(samples)
            if probe.last_error:
                self.log.warn("probe", "inferwatch: torch allocator probe failed: %s", probe.last_error)
        drops = self.drops()
        if events or drops:
            self.active = True
        elif not self.active:
            return
        # After a failed send, HELLO rides with the next events; with no traffic the
        # sidecar is probed again once the (shortened) hello interval has passed.
        hello_due = now >= self.next_hello or (self.need_hello and bool(events))
        last = self.last_drops
        new = {k: v - last.get(k, 0) for k, v in drops.items() if v != last.get(k, 0)}
        if not events and not hello_due and not (new and self.healthy):
            return
        extra: list[tuple[Any, ...]] = []
        if hello_due:
            extra.append(self.hello)
        if new:
            extra.append((EV_DROPS, new))
        encode = self.encoder.encode_counted
        if len(events) <= _ENCODE_CHUNK:
            frames = encode(events, extra)
        else:
            frames = encode(events[:_ENCODE_CHUNK], extra)
            for i in range(_ENCODE_CHUNK, len(events), _ENCODE_CHUNK):
                time.sleep(0)  # releases the GIL: a waiting event loop runs before the next chunk
                frames.extend(encode(events[i : i + _ENCODE_CHUNK]))
        self.recheck = True  # encoding may have counted drops: report them next cycle
        sent = self._send(frames)
        if new and self.head_sent:
            self.last_drops = drops
        if sent and hello_due:
            self.need_hello = False
            self.next_hello = now + self.hello_s

    def _socket(self) -> socket.socket:
        sock = self.sock
        if sock is None:
            if self.address.kind == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            else:
                target = self.address.target
                assert isinstance(target, tuple)
                host, port = target
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_DGRAM)
                sock.setblocking(False)
                sock.connect((host, port))
            sock.setblocking(False)
            self.sock = sock
        return sock

    def _send(self, frames: list[tuple[bytes, int]]) -> bool:
        """Send frames; count what is lost. Returns True when all went through."""
        self.head_sent = False
        try:
            sock = self._socket()
        except OSError as e:
            lost = sum(n for _, n in frames)
            self.counts["send_failed"] += lost
            self._failed("socket", "inferwatch: cannot create the socket for %s: %s", self.address, e)
            return False
        unix = self.address.kind == "unix"
        target = self.address.target
        if unix and not self.healthy:
            # Until a send succeeds (again), check that no other user can have put the socket there.
            # Once healthy the directory cannot change hands, so the send path pays nothing.
            assert isinstance(target, str)
            problem = socket_dir_problem(os.path.dirname(target), shared=True)
            if problem is not None:
                self.counts["socket_untrusted"] += sum(n for _, n in frames)
                self._failed(
                    "untrusted", "inferwatch: not sending to %s: %s. Send to a socket in a directory only root or "
                    "the sidecar's user can write (INFERWATCH_SIDECAR; docs/sdk.md, \"Where events go\")",
                    self.address, problem,
                )
                return False
        ok = True
        for i, (frame, n) in enumerate(frames):
            try:
                for delay in _EAGAIN_BACKOFF_S:
                    try:
                        if unix:
                            sock.sendto(frame, target)  # by path each time: follows a restarted sidecar
                        else:
                            sock.send(frame)
                        break
                    except BlockingIOError:
                        # The receiver's queue is full. This is the sender thread, not the
                        # request path, so it can wait a moment for the sidecar to catch up.
                        if delay is None:
                            raise
                        time.sleep(delay)
            except (FileNotFoundError, ConnectionRefusedError):
                lost = sum(m for _, m in frames[i:])
                self.counts["socket_absent"] += lost
                self._failed(
                    "absent", "inferwatch: no sidecar listening at %s; dropping events until it is back", self.address
                )
                return False
            except OSError as e:
                # EAGAIN (the receiver is behind), EMSGSIZE, EPERM...: drop this frame, try the rest.
                self.counts["send_failed"] += n
                self._failed("send", "inferwatch: sending to %s failed: %s", self.address, e)
                ok = False
                continue
            self.sent_frames += 1
            self.sent_events += n
            if i == 0:
                self.head_sent = True
        if ok:
            self.healthy = True
        return ok

    def _failed(self, key: str, msg: str, *args: Any) -> None:
        self.healthy = False
        self.need_hello = True
        self.next_hello = time.monotonic() + min(self.hello_s, 1.0)
        # The receiver may have restarted and lost our schemas: announce them again.
        self.encoder.forget_announcements()
        self.log.warn(key, msg, *args)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


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
