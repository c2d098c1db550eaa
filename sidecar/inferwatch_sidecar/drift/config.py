"""Config section ``drift:`` of the sidecar."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class DriftConfig(BaseModel):
    """Drift engine settings. Extra keys are rejected so typos fail start-up."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
