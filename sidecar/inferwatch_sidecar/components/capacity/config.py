"""Config section ``capacity:`` of the sidecar (the live knee, docs/capacity.md).

Example::

    capacity:
      window_seconds: 2       # Little's-law window: in flight = summed durations / window
      half_life_seconds: 3600 # older windows weigh half after this long
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CapacityConfig(BaseModel):
    """Live capacity settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the capacity component.
        window_seconds: the windows completions are grouped in; each closed window is one observation of
            (in flight, throughput). Several times the typical latency is best; shorter follows faster.
        half_life_seconds: observations lose half their weight after this long.
        min_windows: a level counts once this many (decayed) windows fell into it.
        max_models: model versions tracked at once (others are dropped and counted).
        evaluate_interval_s: seconds between fits of the knee.
        max_staged: events waiting for the component's thread; beyond it events are dropped and counted.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    window_seconds: float = Field(default=2.0, gt=0, le=3600)
    half_life_seconds: float = Field(default=3600.0, gt=0)
    min_windows: int = Field(default=3, ge=1)
    max_models: int = Field(default=32, ge=1, le=1000)
    evaluate_interval_s: float = Field(default=5.0, gt=0)
    max_staged: int = Field(default=200_000, ge=1000)
