"""Config section ``saturation:`` of the sidecar (docs/saturation.md).

Example::

    saturation:
      gpm:
        backend: auto        # auto | nvml | fake | off
        interval_s: 1.0
      enter: 0.9             # a ratio this high for enter_hold_s makes its resource the bound one
      exit: 0.75             # the bound one is released after exit_hold_s below this
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FakePhase(BaseModel):
    """One phase of the fake GPU's workload (demo, tests): until ``until_s``, this busy share and prefill share.

    Attributes:
        until_s: the phase lasts until this many seconds after the start of the cycle.
        busy: share of the time kernels run.
        prefill: share of that kernel time spent in prefill (the rest is decode).
    """

    model_config = ConfigDict(extra="forbid")

    until_s: float = Field(gt=0)
    busy: float = Field(ge=0, le=1)
    prefill: float = Field(ge=0, le=1)


class GpmConfig(BaseModel):
    """GPU activity sampling.

    Attributes:
        backend: ``auto`` reads NVML when nvidia-ml-py and a driver are there (GPM on Hopper and newer,
            NVML utilization elsewhere, labelled coarse) and runs without GPU inputs otherwise; ``nvml``
            makes a missing NVML a reported fault; ``fake`` runs the fake GPU (``fake``); ``off``.
        interval_s: seconds between samples (GPM needs more than 0.1).
        fake: the fake GPU's workload phases, repeated; one fake device.
        fake_gpm: whether the fake device supports GPM (false models a pre-Hopper GPU).
    """

    model_config = ConfigDict(extra="forbid")

    backend: Literal["auto", "nvml", "fake", "off"] = "auto"
    interval_s: float = Field(1.0, ge=0.15, le=3600)
    fake: list[FakePhase] = Field(default_factory=lambda: [FakePhase(until_s=3600, busy=0.5, prefill=0.5)])
    fake_gpm: bool = True


class SaturationConfig(BaseModel):
    """The saturation verdict: ratios per resource and the binding one, with hysteresis.

    Attributes:
        enabled: build the component (it judges the model versions of the ``engines:`` targets).
        enter / exit: hysteresis thresholds on the smoothed ratios.
        enter_hold_s: a resource must stay above ``enter`` this long to become the bound one (and a
            higher one this long to take over).
        exit_hold_s: the bound resource is released after this long below ``exit``.
        smoothing_s: time constant of the ratios' exponential smoothing.
        switch_margin: a different resource takes over only when higher by this much.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    gpm: GpmConfig = Field(default_factory=GpmConfig)
    enter: float = Field(0.9, gt=0, le=1)
    exit: float = Field(0.75, gt=0, le=1)
    enter_hold_s: float = Field(10.0, ge=0, le=600)
    exit_hold_s: float = Field(20.0, ge=0, le=3600)
    smoothing_s: float = Field(5.0, ge=0, le=600)
    switch_margin: float = Field(0.1, ge=0, le=1)

    @model_validator(mode="after")
    def _order(self) -> SaturationConfig:
        if self.exit >= self.enter:
            raise ValueError(f"exit ({self.exit}) must be below enter ({self.enter}), or the verdict flaps")
        return self
