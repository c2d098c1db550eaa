"""The Triton demo server with PyTriton's start-up handshake race forced on its first attempt.

Run with the Triton venv's Python and the demo server's own options (``--role stable --http-port ...``).
The first ``Triton.run()`` really starts tritonserver, then raises the error PyTriton raises when a model
instance is refused by the handshake socket. The server must stop it and start afresh (it re-executes
itself, without this patch) on the same ports, and serve.
"""

from __future__ import annotations

import sys

from tritonclient.utils import InferenceServerException

from inferwatch_sidecar.demo import triton_server as ts

RACE = ("[400] load failed for model 'credit-risk': version 1 is at UNAVAILABLE state: Internal: "
        "TritonModelException: Model initialize error: Traceback (most recent call last):\n"
        '  File "/tmp/folder/1/communication.py", line 550, in get_config_from_handshake_server\n'
        "    sock.connect(socket_path.as_posix())\nConnectionRefusedError: [Errno 111] Connection refused")
real_run = ts.Triton.run


def run(self: ts.Triton) -> None:
    real_run(self)
    print("RAISING the handshake race", file=sys.stderr, flush=True)
    raise InferenceServerException(RACE)


ts.Triton.run = run  # type: ignore[method-assign]
ts.main(sys.argv[1:])
