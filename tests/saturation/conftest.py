"""Fixtures: the sidecar tests' real daemon."""

from tests.sidecar.conftest import sidecar_factory

__all__ = ["sidecar_factory"]
