"""The ingest socket's directory: no other user may be able to replace the socket, on either side.

A directory of another user inside /tmp is what an attacker on a shared host
creates before the sidecar starts. As root the test makes a real one (chowned
to ``nobody``); as another user it cannot chown, so the process is told it
runs as a different uid, which the same checks see the same way.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import inferwatch
from inferwatch._env import socket_dir_problem
from inferwatch.wire import EV_DROPS
from inferwatch_sidecar.ingest.sockets import IngestError, check_socket_path, open_unix_socket
from tests.helpers.sidecar import REPO
from tests.sdk.conftest import Receiver

NOBODY = 65534


@pytest.fixture
def tmp_dir(sock_dir: Path) -> str:
    """In /tmp itself (sticky, world-writable), like the default /tmp/inferwatch; short for AF_UNIX."""
    return str(sock_dir)


class Foreign:
    """A directory in /tmp that belongs to a uid other than this process's."""

    def __init__(self, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        self.monkeypatch = monkeypatch
        self.me = os.geteuid()
        os.chmod(path, 0o755)
        if self.me == 0:
            os.chown(path, NOBODY, NOBODY)
        else:
            monkeypatch.setattr(os, "geteuid", lambda: self.me + 1)

    def make_ours(self) -> None:
        if self.me == 0:
            os.chown(self.path, 0, 0)
        else:
            self.monkeypatch.setattr(os, "geteuid", lambda: self.me)


@pytest.fixture
def foreign(tmp_dir: str, monkeypatch: pytest.MonkeyPatch) -> Foreign:
    return Foreign(tmp_dir, monkeypatch)


# -- the sidecar ------------------------------------------------------------------------------


def test_a_socket_directory_owned_by_another_user_is_refused_with_what_to_fix(foreign: Foreign) -> None:
    foreign_dir = foreign.path
    path = os.path.join(foreign_dir, "ingest.sock")
    with pytest.raises(IngestError) as e:
        open_unix_socket(path, 0o666, 1 << 16)
    msg = str(e.value)
    assert f"unsafe socket directory: {foreign_dir} belongs to uid " in msg
    assert "whoever created it first controls the socket" in msg
    assert "$XDG_RUNTIME_DIR" in msg and "ingest.socket_dir_shared" in msg
    assert not os.path.lexists(path), "nothing may be bound in a refused directory"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o2777])
def test_a_group_or_world_writable_socket_directory_is_refused(tmp_dir: str, mode: int) -> None:
    os.chmod(tmp_dir, mode)
    path = os.path.join(tmp_dir, "ingest.sock")
    with pytest.raises(IngestError, match=f"can be written by group or others without the sticky bit \\(mode {mode:04o}\\)"):
        open_unix_socket(path, 0o666, 1 << 16)
    assert not os.path.lexists(path)


def test_a_world_writable_directory_with_the_sticky_bit_is_accepted(tmp_dir: str) -> None:
    os.chmod(tmp_dir, 0o1777)
    sock, _ = open_unix_socket(os.path.join(tmp_dir, "ingest.sock"), 0o666, 1 << 16)
    sock.close()


def test_a_shared_emptydir_is_accepted_when_configured(tmp_dir: str) -> None:
    # kubelet makes an emptyDir root-owned, mode 2777 (setgid for the pod's fsGroup), no sticky bit.
    os.chmod(tmp_dir, 0o2777)
    sock, _ = open_unix_socket(os.path.join(tmp_dir, "ingest.sock"), 0o660, 1 << 16, shared_dir=True)
    sock.close()


def test_shared_mode_still_refuses_a_directory_another_user_created_in_tmp(foreign: Foreign) -> None:
    with pytest.raises(IngestError, match="belongs to uid"):
        open_unix_socket(os.path.join(foreign.path, "ingest.sock"), 0o666, 1 << 16, shared_dir=True)


def test_a_writable_parent_is_refused_even_when_the_socket_directory_is_private(tmp_dir: str) -> None:
    os.chmod(tmp_dir, 0o777)
    inner = os.path.join(tmp_dir, "iw")
    with pytest.raises(IngestError, match=f"{tmp_dir} can be written by group or others"):
        open_unix_socket(os.path.join(inner, "ingest.sock"), 0o666, 1 << 16)


def test_a_symlink_to_another_users_directory_is_judged_by_its_target(foreign: Foreign) -> None:
    link_parent = tempfile.mkdtemp(prefix="iwln", dir="/tmp")
    try:
        link = os.path.join(link_parent, "iw")
        os.symlink(foreign.path, link)
        with pytest.raises(IngestError, match=f"{foreign.path} belongs to uid"):
            open_unix_socket(os.path.join(link, "ingest.sock"), 0o666, 1 << 16)
    finally:
        shutil.rmtree(link_parent, ignore_errors=True)


def test_a_missing_directory_is_created_private_to_writers_and_the_socket_binds(tmp_dir: str) -> None:
    d = os.path.join(tmp_dir, "run", "inferwatch")
    path = os.path.join(d, "ingest.sock")
    old = os.umask(0o022)
    try:
        sock, ino = open_unix_socket(path, 0o666, 1 << 16)
    finally:
        os.umask(old)
    try:
        st = os.stat(d)
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o755
        assert os.stat(path).st_ino == ino
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as c:
            c.sendto(b"x", path)
        assert sock.recv(16) == b"x"
    finally:
        sock.close()


def test_a_directory_root_made_for_another_user_is_trusted(tmp_dir: str) -> None:
    """/run/inferwatch owned by the sidecar's user (systemd RuntimeDirectory=) is safe for other users to send to."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")  # the foreign_dir cases cover the refusal
    os.chmod(tmp_dir, 0o755)  # like /run: only root writes here
    d = os.path.join(tmp_dir, "inferwatch")
    os.mkdir(d, 0o755)
    os.chown(d, NOBODY, NOBODY)
    assert socket_dir_problem(d, shared=True) is None
    assert socket_dir_problem(d, shared=True, uid=1234) is None


def test_check_only_creates_nothing_and_checks_the_nearest_existing_directory(tmp_dir: str) -> None:
    path = os.path.join(tmp_dir, "a", "b", "ingest.sock")
    check_socket_path(path, create=False)
    assert not os.path.exists(os.path.join(tmp_dir, "a"))
    os.chmod(tmp_dir, 0o777)
    with pytest.raises(IngestError, match="can be written by group or others"):
        check_socket_path(path, create=False)


def test_the_sidecar_refuses_to_start_in_another_users_directory(foreign: Foreign) -> None:
    if os.geteuid() != 0:
        pytest.skip("a subprocess cannot be told it runs as another uid")  # covered in-process above
    r = subprocess.run(
        [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--socket", os.path.join(foreign.path, "ingest.sock"),
         "--http-port", "0", "--no-gpu", "--no-drift"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))},
    )
    assert r.returncode == 1, r.stderr
    assert "cannot start: ingest.socket: unsafe socket directory" in r.stderr and "belongs to uid 65534 (nobody)" in r.stderr


# -- the SDK ---------------------------------------------------------------------------------


@pytest.fixture
def sdk_off() -> Iterator[None]:
    inferwatch.shutdown(timeout=1.0)
    yield
    inferwatch.shutdown(timeout=1.0)


def test_the_sdk_does_not_send_into_another_users_directory_and_counts_the_events(
    foreign: Foreign, sdk_off: None, caplog: pytest.LogCaptureFixture
) -> None:
    rx = Receiver(os.path.join(foreign.path, "ingest.sock"))
    rx.start()  # the other user's listener
    try:
        assert inferwatch.configure(sidecar=f"unix://{rx.path}", flush_interval_ms=10_000)
        with caplog.at_level(logging.WARNING, logger="inferwatch"):
            for _ in range(3):
                inferwatch.observe_batch(4)
            assert inferwatch.flush() is False
        assert rx.poll(0.1) == [], "nothing may reach a socket another user could own"
        st = inferwatch.stats()
        assert st["drops"] == {"socket_untrusted": 3} and st["sent_frames"] == 0
        assert any("not sending to" in r.getMessage() and "belongs to uid" in r.getMessage() for r in caplog.records)

        # Fixed (the directory is ours again): the next send goes through and reports the count.
        foreign.make_ours()
        inferwatch.observe_batch(4)
        assert inferwatch.flush() is True
        drops = [r for r in rx.records(0.1) if r[0] == EV_DROPS]
        assert drops and drops[-1][1] == {"socket_untrusted": 3}
    finally:
        rx.stop()


def test_the_sdk_sends_to_a_root_owned_emptydir(tmp_dir: str, sdk_off: None) -> None:
    os.chmod(tmp_dir, 0o2777)
    rx = Receiver(os.path.join(tmp_dir, "ingest.sock"))
    rx.start()
    try:
        assert inferwatch.configure(sidecar=f"unix://{rx.path}", flush_interval_ms=10_000)
        inferwatch.observe_batch(4)
        assert inferwatch.flush() is True
        assert inferwatch.stats()["drops"] == {}
        assert rx.records(0.1)
    finally:
        rx.stop()
