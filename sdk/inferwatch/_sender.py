"""The sender thread and the state it shares with the hot path (``Runtime``, ``Settings``).

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

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from inferwatch import _core
from inferwatch._env import Address, socket_dir_problem
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
