"""Config section ``tail:`` of the sidecar (tail attribution, docs/tail.md).

Example::

    tail:
      window_seconds: 300
      max_tail: 512          # slowest requests kept per window and version
      reservoir: 1024        # uniform sample of all requests (the median requests, "the rest")
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TailConfig(BaseModel):
    """Tail attribution settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the tail component.
        window_seconds: length of each (tumbling) analysis window.
        max_tail: slowest requests kept per window and model version; a tail group larger than this
            (1% of more than ``100 * max_tail`` requests) is cut to the slowest ``max_tail``.
        reservoir: size of the uniform sample of every request of the window, which gives the median
            requests and "the rest" the tail is compared with.
        min_tail_requests: a tail group with fewer requests is not analysed (the 0.1% tail needs
            ``1000 * min_tail_requests`` requests in a window).
        alpha: false-discovery rate (Benjamini-Hochberg across the features of one tail group).
        numeric_effect_floor / categorical_effect_floor: the drift engine's effect floors.
        bins / top_k: resolution of the reference built from "the rest" (percentile bins, categories).
        max_models: model versions tracked at once (others are dropped and counted).
        max_features: features per model version taken into the comparison.
        max_pending: records waiting for their request, and kept requests waiting for their record.
        max_staged: events waiting for the component's thread; beyond it events are dropped and counted.
        max_pending_bytes: estimated bytes of the records waiting for their request (their features); past
            it the oldest are dropped and counted as ``unmatched_record``.
        max_window_bytes: estimated bytes of the features the windows' kept requests hold, over all model
            versions (16 versions x 1,536 kept rows x 32 features of 64 characters would be ~100 MiB; numeric
            values are kept as doubles, 8 bytes each, so the default holds ~15,000 rows of 20 numeric features);
            past it a kept request keeps its latency and stages without features, counted as ``window_full``.
        max_staged_bytes: estimated bytes of the staged events (an upper bound from their feature counts);
            past it events are dropped and counted as ``staging_full``. Past half of it the component's thread
            drains at once rather than at its next tick.
        seed: seed of the reservoir sampling, so results are reproducible.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    window_seconds: float = Field(default=300.0, gt=0)
    max_tail: int = Field(default=512, ge=10, le=65_536)
    reservoir: int = Field(default=1024, ge=100, le=65_536)
    min_tail_requests: int = Field(default=20, ge=5)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    numeric_effect_floor: float = Field(default=0.1, ge=0)
    categorical_effect_floor: float = Field(default=0.1, ge=0)
    bins: int = Field(default=50, ge=10, le=200, multiple_of=10)
    top_k: int = Field(default=16, ge=1, le=256)
    max_models: int = Field(default=16, ge=1, le=1000)
    max_features: int = Field(default=32, ge=1, le=256)
    max_pending: int = Field(default=50_000, ge=100)
    max_staged: int = Field(default=200_000, ge=1000)
    max_pending_bytes: int = Field(default=4 << 20, ge=1 << 16)
    max_window_bytes: int = Field(default=4 << 20, ge=1 << 16)
    max_staged_bytes: int = Field(default=8 << 20, ge=1 << 20)
    seed: int = 0
