"""The capacity tests start real sidecars the way the sidecar tests do."""

from tests.sidecar.conftest import sidecar_factory

__all__ = ["sidecar_factory"]
