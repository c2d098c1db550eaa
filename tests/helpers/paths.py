"""Where things are in the checkout, for tests at any depth of tests/ (no ``parents[N]`` to recount on a move)."""

from __future__ import annotations

from pathlib import Path

#: The checkout's root.
REPO = Path(__file__).resolve().parents[2]
#: The tests' root.
TESTS = REPO / "tests"
#: Recorded data the tests read (engine spans and metrics, a demo poll).
FIXTURES = TESTS / "fixtures"
#: The benchmarks, some of which tests load as modules.
BENCH = REPO / "bench"
