"""Write the tiny offline Llama of :mod:`inferwatch_sidecar.demo.tiny_llm` into a folder.

The real-vLLM test runs this with the vLLM venv's interpreter, which has
``torch``, ``transformers`` and ``tokenizers`` but not inferwatch, so the
sidecar's source folder goes on its path first:
``.venv-vllm/bin/python tests/traces/make_tiny_llm.py DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sidecar"))

from inferwatch_sidecar.demo.tiny_llm import make  # noqa: E402 - after the path above

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_llm.py DIR")
    make(Path(sys.argv[1]))
