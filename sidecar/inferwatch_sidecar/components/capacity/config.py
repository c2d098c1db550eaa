"""Config section ``capacity:`` of the sidecar (the live knee, docs/capacity.md).

Example::

    capacity:
      window_seconds: 2       # Little's-law window: in flight = summed durations / window
      half_life_seconds: 3600 # older windows weigh half after this long
      slo:                    # goodput: the share of requests meeting every threshold
        - model: tiny-llama
          ttft_seconds: 0.5
          itl_seconds: 0.05
          e2e_seconds: 10
          objective: 0.99     # burn-rate alerts when more than 1% miss
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Objective(BaseModel):
    """A model's service-level objectives: a good request meets every threshold given.

    Attributes:
        model: the model name it applies to ("*": every model without its own objective).
        ttft_seconds: time to first token of the request's first streamed stage.
        itl_seconds: mean inter-token latency of that stream.
        e2e_seconds: end-to-end duration.
        objective: the share of requests that must be good (0.99: the thresholds are p99 targets).
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "*"
    ttft_seconds: float | None = Field(default=None, gt=0)
    itl_seconds: float | None = Field(default=None, gt=0)
    e2e_seconds: float | None = Field(default=None, gt=0)
    objective: float = Field(default=0.99, gt=0, lt=1)

    @model_validator(mode="after")
    def _some_threshold(self) -> Objective:
        if self.ttft_seconds is None and self.itl_seconds is None and self.e2e_seconds is None:
            raise ValueError(f"capacity.slo for model {self.model!r}: give at least one of ttft_seconds, "
                             "itl_seconds, e2e_seconds")
        return self


class CapacityConfig(BaseModel):
    """Live capacity settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the capacity component.
        window_seconds: the windows completions are grouped in; each closed window is one observation of
            (in flight, throughput). Several times the typical latency is best; shorter follows faster.
        half_life_seconds: observations lose half their weight after this long.
        min_windows: a level counts once this many windows fell into it, while their decayed weight is still at
            least half of that.
        max_models: model versions tracked at once (others are dropped and counted).
        evaluate_interval_s: seconds between fits of the knee.
        max_staged: events waiting for the component's thread; beyond it events are dropped and counted.
        slo: per-model objectives; each gives inferwatch_slo_goodput_ratio and the burn-rate alerts.
        goodput_window_seconds: the window of inferwatch_slo_goodput_ratio.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    window_seconds: float = Field(default=2.0, gt=0, le=3600)
    half_life_seconds: float = Field(default=3600.0, gt=0)
    min_windows: int = Field(default=3, ge=1)
    max_models: int = Field(default=32, ge=1, le=1000)
    evaluate_interval_s: float = Field(default=5.0, gt=0)
    max_staged: int = Field(default=200_000, ge=1000)
    slo: list[Objective] = Field(default_factory=list)
    goodput_window_seconds: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _one_objective_per_model(self) -> CapacityConfig:
        seen = [o.model for o in self.slo]
        dup = sorted({m for m in seen if seen.count(m) > 1})
        if dup:
            raise ValueError(f"capacity.slo: more than one objective for model(s) {dup}")
        return self
