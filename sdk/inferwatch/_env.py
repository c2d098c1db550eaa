"""Every ``INFERWATCH_*`` environment variable the SDK reads, in one place.

``configure()`` takes each setting as a keyword argument; an argument left as
``None`` falls back to the variable below, then to the default. A variable
that is set but malformed makes ``configure()`` raise ``ValueError`` naming
the variable, because configuration is where we are strict.

| variable | default | meaning |
| --- | --- | --- |
| ``INFERWATCH_ENABLED`` | ``true`` | ``false``/``0``/``no``/``off`` turns every API into a no-op |
| ``INFERWATCH_SERVICE`` | ``unknown_service`` | service name sent with every event |
| ``INFERWATCH_MODEL`` | unset | default model name (``request(model=...)`` overrides it) |
| ``INFERWATCH_MODEL_VERSION`` | unset | default model version |
| ``INFERWATCH_SIDECAR`` | ``unix:///tmp/inferwatch/ingest.sock`` | where to send: ``unix:///path``, a bare absolute path, or ``udp://127.0.0.1:PORT`` |
| ``INFERWATCH_BUFFER_SIZE`` | ``16384`` | events held in memory before new ones are dropped (``buffer_full``) |
| ``INFERWATCH_FLUSH_INTERVAL_MS`` | ``50`` | how often the background thread drains the buffer |
| ``INFERWATCH_HELLO_INTERVAL_S`` | ``10`` | how often a HELLO (and the drop counts) is sent even without traffic |
| ``INFERWATCH_SCHEMA_REPEAT_S`` | ``2`` | re-announce each feature schema at least this often |
| ``INFERWATCH_OTEL_SPANS`` | ``false`` | also open an OpenTelemetry span per stage (needs opentelemetry-api) |
| ``INFERWATCH_TORCH_PROBE`` | ``false`` | sample ``torch.cuda.memory_stats()`` in the background |
| ``INFERWATCH_TORCH_PROBE_INTERVAL_S`` | ``10`` | seconds between allocator samples |
| ``INFERWATCH_TORCH_HISTORY`` | ``false`` | let the torch probe record the allocator's history for a bounded time when its allocated floor rises, and name the allocation sites that stayed live (docs/gpu.md) |
| ``INFERWATCH_SIDECAR_HTTP`` | ``http://127.0.0.1:9464`` | the sidecar's HTTP address, where :func:`inferwatch.record_offline` posts offline feature values (``POST /v1/skew``, docs/skew.md) |
| ``INFERWATCH_SKEW_SAMPLE_RATIO`` | ``0`` | share of request IDs :func:`inferwatch.skew_sampled` says yes to (the training-serving skew sample, at most 0.1; 0 turns it off); read once |
| ``INFERWATCH_LOG_REQUEST_ID`` | ``request_id`` | what :class:`inferwatch.RequestIdFilter` puts in ``%(request_id)s``: ``request_id`` (the client's ``X-Request-ID`` when it sent one) or ``trace_id`` (the W3C trace ID when the request has one, else the request ID); read when the filter is created |
| ``INFERWATCH_HTTP_EXCLUDE`` | probes, docs, ``/metrics`` | comma-separated paths or route templates the ASGI middleware leaves out of the request metrics (counted only in ``inferwatch_http_requests_total``) |
| ``INFERWATCH_HTTP_INCLUDE`` | unset | comma-separated paths taken back out of the excluded ones |

The sidecar imports :data:`DEFAULT_SOCKET` so both sides agree on the default
address, and :func:`socket_dir_problem` so both sides judge a socket's
directory by the same rules.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import NamedTuple

__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_SIDECAR",
    "ENV_VARS",
    "Address",
    "parse_address",
    "socket_dir_problem",
    "LOG_REQUEST_ID_CHOICES",
    "env_bool",
    "env_choice",
    "env_float",
    "env_int",
    "env_str",
]

#: The default ingest socket: a Unix datagram socket. The sidecar binds it.
DEFAULT_SOCKET = "/tmp/inferwatch/ingest.sock"
#: The default value of ``INFERWATCH_SIDECAR``.
DEFAULT_SIDECAR = "unix://" + DEFAULT_SOCKET

#: Variable name -> one-line description (the table above, for ``--help`` texts and tests).
ENV_VARS: dict[str, str] = {
    "INFERWATCH_ENABLED": "true/false: false turns every API into a no-op (default true)",
    "INFERWATCH_SERVICE": "service name sent with every event (default unknown_service)",
    "INFERWATCH_MODEL": "default model name",
    "INFERWATCH_MODEL_VERSION": "default model version",
    "INFERWATCH_SIDECAR": f"unix:///path, /abs/path or udp://127.0.0.1:PORT (default {DEFAULT_SIDECAR})",
    "INFERWATCH_BUFFER_SIZE": "events buffered before dropping new ones (default 16384)",
    "INFERWATCH_FLUSH_INTERVAL_MS": "background drain interval in ms (default 50)",
    "INFERWATCH_HELLO_INTERVAL_S": "seconds between HELLO/drop-count reports (default 10)",
    "INFERWATCH_SCHEMA_REPEAT_S": "seconds between schema re-announcements (default 2)",
    "INFERWATCH_OTEL_SPANS": "true/false: one OpenTelemetry span per stage (default false)",
    "INFERWATCH_TORCH_PROBE": "true/false: sample torch.cuda.memory_stats() (default false)",
    "INFERWATCH_TORCH_PROBE_INTERVAL_S": "seconds between allocator samples (default 10)",
    "INFERWATCH_TORCH_HISTORY": "true/false: the torch probe's bounded allocator-history capture (default false)",
    "INFERWATCH_SIDECAR_HTTP": "the sidecar's HTTP address for record_offline() (default http://127.0.0.1:9464)",
    "INFERWATCH_SKEW_SAMPLE_RATIO": "share of request IDs skew_sampled() says yes to (default 0: off, at most 0.1)",
    "INFERWATCH_LOG_REQUEST_ID": "request_id/trace_id: the ID RequestIdFilter puts in %(request_id)s "
                                 "(default request_id)",
    "INFERWATCH_HTTP_EXCLUDE": "comma-separated paths/route templates the ASGI middleware leaves out of request "
                               "metrics (default: probes, docs, /metrics)",
    "INFERWATCH_HTTP_INCLUDE": "comma-separated paths taken back out of INFERWATCH_HTTP_EXCLUDE",
}

#: The values of ``INFERWATCH_LOG_REQUEST_ID``.
LOG_REQUEST_ID_CHOICES = ("request_id", "trace_id")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class Address(NamedTuple):
    """A parsed sidecar address.

    Attributes:
        kind: ``"unix"`` or ``"udp"``.
        target: the socket path (unix) or ``(host, port)`` (udp).
    """

    kind: str
    target: str | tuple[str, int]

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix://{self.target}"
        assert isinstance(self.target, tuple)
        host, port = self.target
        return f"udp://[{host}]:{port}" if ":" in host else f"udp://{host}:{port}"


def parse_address(value: str, source: str = "sidecar") -> Address:
    """Parse a sidecar address.

    Args:
        value: ``unix:///abs/path``, ``/abs/path`` or ``udp://HOST:PORT``.
        source: what to name in the error message (argument or variable).

    Returns:
        The parsed address.

    Raises:
        ValueError: the address is not one of the forms above.
    """
    v = value.strip()
    hint = f"{source}={value!r}: expected unix:///absolute/path, /absolute/path or udp://127.0.0.1:PORT"
    if v.startswith("unix://"):
        path = v[len("unix://") :]
        if not path.startswith("/"):
            raise ValueError(hint + " (a unix path must be absolute: unix:// followed by /...)")
        return Address("unix", path)
    if v.startswith("/"):
        return Address("unix", v)
    if v.startswith("udp://"):
        rest = v[len("udp://") :]
        host, sep, port_s = rest.rpartition(":")
        if not sep or not host or not port_s.isdigit():
            raise ValueError(hint)
        port = int(port_s)
        if not 0 < port < 65536:
            raise ValueError(hint + " (port out of range)")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        return Address("udp", (host, port))
    raise ValueError(hint)


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _others_can_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def socket_dir_problem(directory: str, *, shared: bool = False, uid: int | None = None) -> str | None:
    """Why another user could replace a socket in ``directory``, or None when none could.

    The rules are OpenSSH's ``StrictModes`` for every directory from
    ``directory`` (symlinks resolved) up to ``/``:

    - no directory may be writable by group or others unless it has the sticky
      bit (as ``/tmp`` has: then nobody removes or renames what is not theirs).
      ``shared=True`` waives this for ``directory`` itself: a Kubernetes emptyDir
      is world-writable, and only the pod's containers can reach it;
    - each directory belongs to root or to ``uid``, or else sits in a parent
      that only its owner can write (root made it for that user, as systemd's
      ``RuntimeDirectory=`` or a home directory). A directory of another user
      inside ``/tmp`` is refused: whoever created it first owns the socket.

    A directory that does not exist yet is no problem (nothing can be sent
    there); its creator is checked once it exists.

    Args:
        directory: the directory the socket is (or will be) bound in.
        shared: accept a group- or world-writable ``directory`` (see above).
        uid: the trusted user besides root (default: this process's effective uid).

    Returns:
        One sentence naming the directory and what is wrong with it, or None.
    """
    me = os.geteuid() if uid is None else uid
    try:
        path = os.path.realpath(directory)
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    leaf = True
    while True:
        parent = os.path.dirname(path)
        try:
            pst = os.stat(parent) if parent != path else None
        except OSError as e:
            return f"cannot check {parent}: {e.strerror}"
        if _others_can_write(st) and not st.st_mode & stat.S_ISVTX and not (leaf and shared):
            return (
                f"{path} can be written by group or others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o}),"
                " so another user could replace the socket"
            )
        if st.st_uid not in (0, me) and (pst is None or _others_can_write(pst)):
            return (
                f"{path} belongs to {_owner(st.st_uid)}, not to this user ({_owner(me)}) or root, in a directory other"
                " users can write: whoever created it first controls the socket"
            )
        if pst is None:
            return None
        path, st, leaf = parent, pst, False


def env_str(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, or None when unset or blank."""
    v = (os.environ if env is None else env).get(name)
    if v is None or not v.strip():
        return None
    return v.strip()


def env_bool(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    """Parse a boolean variable (true/false, 1/0, yes/no, on/off)."""
    v = (os.environ if env is None else env).get(name)
    if v is None:
        return default
    s = v.strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False if s else default
    raise ValueError(f"{name}={v!r}: expected true or false")


def env_int(name: str, default: int, minimum: int, maximum: int, env: Mapping[str, str] | None = None) -> int:
    """Parse an integer variable within ``[minimum, maximum]``."""
    v = env_str(name, env)
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r}: expected an integer between {minimum} and {maximum}") from None
    if not minimum <= n <= maximum:
        raise ValueError(f"{name}={v!r}: expected an integer between {minimum} and {maximum}")
    return n


def env_float(name: str, default: float, minimum: float, maximum: float, env: Mapping[str, str] | None = None) -> float:
    """Parse a number variable within ``[minimum, maximum]``."""
    v = env_str(name, env)
    if v is None:
        return default
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"{name}={v!r}: expected a number between {minimum} and {maximum}") from None
    if not minimum <= x <= maximum:  # also rejects NaN
        raise ValueError(f"{name}={v!r}: expected a number between {minimum} and {maximum}")
    return x


def env_choice(name: str, default: str, choices: tuple[str, ...], env: Mapping[str, str] | None = None) -> str:
    """Parse a variable that takes one of ``choices`` (case-insensitive)."""
    v = env_str(name, env)
    if v is None:
        return default
    s = v.lower()
    if s not in choices:
        raise ValueError(f"{name}={v!r}: expected one of {', '.join(choices)}")
    return s
