"""Config section ``gpu:`` of the sidecar."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class GpuConfig(BaseModel):
    """GPU monitor settings. Extra keys are rejected so typos fail start-up."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
