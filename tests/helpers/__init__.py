"""Helpers every test package shares: ports (:mod:`.net`) and a real sidecar (:mod:`.sidecar`).

Plain modules, imported by name (``from tests.helpers.net import free_port``); the fixtures built on them
(``sidecar_factory``) are in tests/conftest.py, so every package has them.
"""
