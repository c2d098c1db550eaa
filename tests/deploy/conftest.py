"""Fixtures of the deploy tests."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import IN_CI


@pytest.fixture(scope="session")
def kubectl() -> str:
    """Path of kubectl, whose ``kubectl kustomize`` renders deploy/k8s.

    Locally a missing kubectl skips the test; in CI (CI=true) it fails it, because CI must have it.
    """
    path = shutil.which("kubectl")
    if path is None:
        msg = ("kubectl is not on PATH: install kubectl 1.21 or later (Debian bookworm's kubernetes-client 1.20 "
               "embeds kustomize 2.0.3, which has no components)")
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path
