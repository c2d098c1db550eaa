"""Ingest sockets: the SDK's Unix datagram socket and UDP on loopback.

One thread waits on both sockets with ``selectors`` and drains each ready
socket without blocking, decoding and aggregating every datagram inline.
The kernel's socket queue is the only queue, so memory is bounded whatever
the offered rate. Past it, Unix-socket senders get ``EAGAIN`` (the SDK
retries briefly, then counts ``send_failed``) and UDP datagrams are dropped
by the kernel, which we read back from ``/proc/net/udp`` at scrape time.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import stat
import threading
from typing import Any

from inferwatch._env import socket_dir_problem
from inferwatch_sidecar.export.priority import PRIORITY
from inferwatch_sidecar.ingest.pipeline import Pipeline

log = logging.getLogger("inferwatch.sidecar.ingest")

#: Largest datagram read; the wire format caps frames at 65,000 bytes.
RECV_SIZE = 65536
#: Datagrams read from one socket before looking at the other and the exit flag.
DRAIN_BATCH = 4096
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


class IngestError(Exception):
    """An ingest socket that cannot be opened; the message says what to fix."""


def _set_rcvbuf(sock: socket.socket, size: int) -> int:
    # SO_RCVBUFFORCE ignores net.core.rmem_max but needs CAP_NET_ADMIN; fall back quietly.
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        except OSError:
            pass
    # Linux reports double the requested size (bookkeeping overhead).
    return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))


#: Mode of a socket directory the sidecar creates: only we may add or remove
#: entries; senders of other users may reach the socket (its own mode decides).
SOCKET_DIR_MODE = 0o755

_DIR_FIX = (
    "use a directory only this user (or root) can write: remove it and let the sidecar create it, set "
    "ingest.socket to one under a private runtime directory such as $XDG_RUNTIME_DIR or /run/inferwatch, "
    "or, on a Kubernetes emptyDir shared with the model server, set ingest.socket_dir_shared: true "
    "(docs/sidecar.md, \"The socket's directory\")"
)


def check_socket_path(path: str, shared_dir: bool = False, create: bool = True) -> None:
    """Refuse a socket path that another user could take over; create its directory if asked.

    The directory must pass :func:`inferwatch._env.socket_dir_problem` (the
    SDK applies the same rules before it sends). A missing directory is
    created with :data:`SOCKET_DIR_MODE`, or, with ``create=False``
    (``--check-config``), its nearest existing ancestor must be safe and
    writable by us.

    Raises:
        IngestError: what is wrong and how to fix it.
    """
    d = os.path.dirname(os.path.abspath(path))
    if create:
        try:
            os.makedirs(d, mode=SOCKET_DIR_MODE, exist_ok=True)
        except OSError as e:
            raise IngestError(f"ingest.socket: cannot create directory {d}: {e.strerror}") from None
    elif not os.path.isdir(d):
        base = d
        while not os.path.isdir(base):
            base = os.path.dirname(base)
        problem = socket_dir_problem(base)
        if problem is not None:
            raise IngestError(f"ingest.socket: unsafe socket directory: {problem}; {_DIR_FIX}")
        if not os.access(base, os.W_OK | os.X_OK):
            raise IngestError(f"ingest.socket: cannot create directory {d}: {base} is not writable by this user")
        return
    problem = socket_dir_problem(d, shared=shared_dir)
    if problem is not None:
        raise IngestError(f"ingest.socket: unsafe socket directory: {problem}; {_DIR_FIX}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise IngestError(f"ingest.socket: {path} exists and is not a socket; remove it or choose another path")


def open_unix_socket(path: str, mode: int, rcvbuf: int, shared_dir: bool = False) -> tuple[socket.socket, int]:
    """Bind the Unix datagram socket at ``path``.

    Checks the path with :func:`check_socket_path` (creating the directory if
    needed), removes a stale socket file left by a crashed sidecar, refuses
    to replace a live one or a non-socket file.

    Returns:
        The bound non-blocking socket and the socket file's inode (so
        shutdown removes only our own file).
    """
    check_socket_path(path, shared_dir)
    if os.path.lexists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(path)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                probe.close()
                raise IngestError(f"ingest.socket: cannot check existing socket {path}: {e.strerror}") from None
            log.info("removing stale socket %s", path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                probe.close()
                raise IngestError(f"ingest.socket: cannot remove the stale socket {path}: {e.strerror}") from None
        else:
            probe.close()
            raise IngestError(f"ingest.socket: another process is already receiving on {path} (another sidecar?)")
        probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise IngestError(f"ingest.socket: cannot bind {path}: {e.strerror}") from None
    os.chmod(path, mode)
    _set_rcvbuf(sock, rcvbuf)
    sock.setblocking(False)
    return sock, os.stat(path).st_ino


def resolve_udp(host: str, port: int) -> tuple[int, Any]:
    """The address family and socket address to bind for UDP ingest (raises IngestError)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise IngestError(f"ingest.udp_host: cannot resolve {host!r}: {e}") from None
    family, _, _, _, addr = infos[0]
    return family, addr


def open_udp_socket(host: str, port: int, rcvbuf: int) -> socket.socket:
    """Bind the UDP ingest socket."""
    family, addr = resolve_udp(host, port)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise IngestError(f"ingest.udp_port: cannot bind {host}:{port}: {e.strerror}") from None
    _set_rcvbuf(sock, rcvbuf)
    sock.setblocking(False)
    return sock


def udp_kernel_drops(sock: socket.socket) -> int:
    """Datagrams the kernel dropped on ``sock`` (the ``drops`` column of /proc/net/udp)."""
    ino = os.fstat(sock.fileno()).st_ino
    total = 0
    for name in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(name, encoding="ascii") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) >= 13 and parts[9] == str(ino):
                        total += int(parts[12])
        except (OSError, StopIteration, ValueError):
            continue
    return total


class IngestThread:
    """Receives datagrams on the configured sockets and feeds the pipeline, on one thread.

    Why one thread and no user-space queue: with a separate reader thread, every
    ``recv`` releases the GIL and the reader then waits up to a switch interval to
    get it back from the decoding thread, a convoy that halved throughput in our
    measurements (bench/ingest.py). Decoding inline, the kernel's socket queue is
    the only queue, so memory is bounded by construction; a producer that finds it
    full retries briefly from its sender thread and then counts ``send_failed``.

    Args:
        pipeline: where frames go.
        unix_path: Unix socket path, or None.
        unix_mode: socket file permissions.
        udp: ``(host, port)`` or None.
        rcvbuf: requested kernel receive buffer per socket.
        unix_dir_shared: accept a group- or world-writable socket directory
            (a Kubernetes emptyDir; ``ingest.socket_dir_shared``).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        unix_path: str | None,
        unix_mode: int = 0o666,
        udp: tuple[str, int] | None = None,
        rcvbuf: int = 8 << 20,
        unix_dir_shared: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.unix_path = unix_path
        self.unix_mode = unix_mode
        self.unix_dir_shared = unix_dir_shared
        self.udp = udp
        self.rcvbuf = rcvbuf
        self.should_exit = threading.Event()
        self._thread: threading.Thread | None = None
        self._unix: socket.socket | None = None
        self._unix_ino: int | None = None
        self._udp: socket.socket | None = None
        self.udp_port: int | None = None
        self.recv_errors = 0
        self.rcvbuf_effective: dict[str, int] = {}

    def open(self) -> None:
        """Bind the sockets (raises IngestError with a clear message)."""
        try:
            if self.unix_path:
                self._unix, self._unix_ino = open_unix_socket(
                    self.unix_path, self.unix_mode, self.rcvbuf, self.unix_dir_shared
                )
                self.rcvbuf_effective["unix"] = int(self._unix.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
            if self.udp is not None:
                self._udp = open_udp_socket(self.udp[0], self.udp[1], self.rcvbuf)
                self.udp_port = int(self._udp.getsockname()[1])
                self.rcvbuf_effective["udp"] = int(self._udp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
                udp_sock = self._udp
                self.pipeline.socket_drop_sources.append(lambda: udp_kernel_drops(udp_sock))
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inferwatch-ingest", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        if self._unix is not None:
            sel.register(self._unix, selectors.EVENT_READ, "unix")
        if self._udp is not None:
            sel.register(self._udp, selectors.EVENT_READ, "udp")
        try:
            while not self.should_exit.is_set():
                for key, _ in sel.select(timeout=0.1):
                    self._drain(key.fileobj, key.data, DRAIN_BATCH)
            # Graceful stop: the socket file is already gone, so nothing new arrives;
            # what the kernel already holds was accepted from producers, so count it.
            for key in list(sel.get_map().values()):
                self._drain(key.fileobj, key.data, 1 << 30)
        finally:
            sel.close()

    def _drain(self, sock: Any, transport: str, limit: int) -> None:
        recv = sock.recv
        datagram = self.pipeline.datagram
        prio = PRIORITY
        for _ in range(limit):
            try:
                buf = recv(RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.recv_errors += 1
                return
            if prio.active:
                # A scrape is answered: let it have the interpreter (export/priority.py). After the recv, so the
                # thread steps aside only holding a datagram, which is what makes the scrape see events arriving.
                prio.pause(ingest=True)
            datagram(buf, transport)

    def stop(self, timeout: float) -> None:
        """Stop receiving and close the sockets, counting what already arrived.

        The socket file is removed first, so producers see ``socket_absent``
        (and count their drops) from that instant; then the kernel queue is
        drained into the pipeline.
        """
        self._unlink_own()
        self.should_exit.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()

    def _unlink_own(self) -> None:
        # Remove the file only if it is still ours (a new sidecar may have replaced it).
        try:
            if self.unix_path and self._unix_ino is not None and os.stat(self.unix_path).st_ino == self._unix_ino:
                os.unlink(self.unix_path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._unix is not None:
            self._unix.close()
            self._unix = None
            self._unlink_own()
        if self._udp is not None:
            self._udp.close()
            self._udp = None
