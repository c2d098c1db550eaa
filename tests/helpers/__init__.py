"""Helpers every test package shares: ports (:mod:`.net`), a real sidecar (:mod:`.sidecar`), an SDK producer
process (:mod:`.sdk_producer`), the checkout's paths (:mod:`.paths`) and quiet imports (:mod:`.imports`).

Plain modules, imported by name (``from tests.helpers.net import free_port``); the fixtures built on them
(``sidecar_factory``) are in tests/conftest.py, so every package has them. tests/README.md lists them.
"""
