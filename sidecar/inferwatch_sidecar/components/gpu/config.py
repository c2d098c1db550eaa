"""Config section ``gpu:`` of the sidecar.

Example::

    gpu:
      backend: auto          # auto | nvml | fake | replay
      interval_s: 1.0
      detector:
        scales: [[720, 10], [3600, 30], [14400, 120]]
      fake:                  # only with backend: fake (demo, end-to-end tests)
        devices: 1
        total_gib: 80
        processes: [{pid: 4242, base_gib: 20, leak_mib_per_s: 2, leak_start_s: 60}]
      replay:                # only with backend: replay
        files: [gpu.csv, apps.csv]
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class DetectorConfig(BaseModel):
    """Leak detector settings (see docs/gpu.md for what each test does).

    Attributes:
        scales: ``(window_s, bin_s)`` pairs. Each scale keeps the per-bin minimum over
            ``window_s`` seconds; a short scale catches fast leaks quickly, a long one
            catches slow leaks. Every window must hold 16 to 1000 bins.
        sub_windows: the window is cut into this many sub-windows whose floors must
            all rise (kills steps, warm-up plateaus, sawtooth).
        min_rate_bytes_per_s: the lower confidence bound of the slope must exceed
            this (default 16 MiB/h): slower growth is not worth paging anyone for.
        z: one-sided Mann-Kendall z the bin floors must exceed.
        balance: the Theil-Sen slopes of the window's two halves must agree within a
            factor ``1/balance`` (a warm-up decelerates, a step lands in one half).
        noise_k: the floor's rise over the window must exceed this many robust standard
            deviations (MAD) of the floors around the trend line.
        jitter_k: ...and this many typical upward steps between consecutive raw samples
            (a sawtooth sampled at 1 s aliases into a slow creep of its sampled trough).
        min_rise_ratio: the smallest positive sub-window rise must be at least this share
            of the largest (model loads give a few GiB-sized rises, a creep similar ones).
        max_step_share: no single bin-to-bin rise of the backward running minimum may
            carry more than this share of the window's total rise (a staircase of a
            few steps is not a creep).
        warmup_s: no verdict in a series' first ``warmup_s`` seconds: start-up growth
            (weights, CUDA graphs, KV cache, first batch shapes) is not a leak.
        confirm_s: the leak conditions must hold this long before the verdict flips.
        clear_s: and must fail this long before it flips back.
        confidence: two-sided level of the Theil-Sen (Sen's) interval for the rate.
    """

    model_config = ConfigDict(extra="forbid")

    scales: list[tuple[float, float]] = Field(default_factory=lambda: [(720.0, 10.0), (3600.0, 30.0), (14400.0, 120.0)])
    sub_windows: int = Field(4, ge=3, le=12)
    min_rate_bytes_per_s: float = Field(16 * 2**20 / 3600, ge=0)
    z: float = Field(3.09, gt=0)
    balance: float = Field(0.4, gt=0, le=1)
    noise_k: float = Field(6.0, ge=0)
    jitter_k: float = Field(1.0, ge=0)
    min_rise_ratio: float = Field(0.15, ge=0, le=1)
    max_step_share: float = Field(0.3, gt=0, le=1)
    confirm_s: float = Field(60.0, ge=0)
    warmup_s: float = Field(1800.0, ge=0)
    clear_s: float = Field(300.0, ge=0)
    confidence: float = Field(0.95, gt=0.5, lt=1)

    @field_validator("scales")
    @classmethod
    def _check_scales(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if not v:
            raise ValueError("gpu.detector.scales needs at least one [window_s, bin_s] pair")
        for w, b in v:
            if b <= 0 or w <= 0:
                raise ValueError(f"gpu.detector.scales: [{w}, {b}] must be positive")
            n = w / b
            if not 16 <= n <= 1000:
                raise ValueError(
                    f"gpu.detector.scales: [{w}, {b}] gives {n:.0f} bins per window; use 16 to 1000 "
                    "(raise bin_s for long windows)"
                )
        return sorted(v)


class FakeProcess(BaseModel):
    """One scripted process on every fake device."""

    model_config = ConfigDict(extra="forbid")

    pid: int = Field(ge=1)
    base_gib: float = Field(4.0, ge=0)
    leak_mib_per_s: float = Field(0.0, ge=0)
    leak_start_s: float = Field(0.0, ge=0)
    noise_mib: float = Field(0.0, ge=0)


class FakeConfig(BaseModel):
    """A scripted fake NVML for demos and end-to-end tests (never for production)."""

    model_config = ConfigDict(extra="forbid")

    devices: int = Field(1, ge=1, le=16)
    total_gib: float = Field(80.0, gt=0)
    processes: list[FakeProcess] = Field(default_factory=list)
    #: Shortcut for one leaking process: pid, leak_mib_per_s, leak_start_s.
    pid: int | None = Field(None, ge=1)
    leak_mib_per_s: float = Field(0.0, ge=0)
    leak_start_s: float = Field(0.0, ge=0)
    base_gib: float = Field(4.0, ge=0)
    seed: int = 0

    @model_validator(mode="after")
    def _shortcut(self) -> FakeConfig:
        if self.pid is not None:
            self.processes = [
                *self.processes,
                FakeProcess(
                    pid=self.pid, base_gib=self.base_gib, leak_mib_per_s=self.leak_mib_per_s,
                    leak_start_s=self.leak_start_s,
                ),
            ]
        return self


class ReplayConfig(BaseModel):
    """Replay recorded nvidia-smi CSV logs as if they were live."""

    model_config = ConfigDict(extra="forbid")

    files: list[str] = Field(default_factory=list)
    #: Start over at the end of the log (demo); otherwise the replay stops there.
    loop: bool = False


class GpuConfig(BaseModel):
    """GPU monitor settings. Extra keys are rejected so typos fail start-up."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    backend: str = Field("auto", pattern="^(auto|nvml|fake|replay)$")
    interval_s: float = Field(1.0, ge=0.01, le=3600)
    detector: DetectorConfig = Field(default_factory=DetectorConfig)
    fake: FakeConfig = Field(default_factory=FakeConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    #: A PID missing from NVML's process list (and silent on the allocator
    #: channel) for this long is dead: its series and detectors are removed.
    pid_ttl_s: float = Field(30.0, gt=0)
    #: How often a failed nvmlInit is retried.
    reinit_s: float = Field(30.0, gt=0)
    #: Fragmentation warning: alloc retries per second over the last minute above this...
    frag_retry_rate_per_s: float = Field(0.01, ge=0)
    #: ...or inactive-split bytes / reserved bytes above this.
    frag_inactive_split_ratio: float = Field(0.3, gt=0, le=1)
    #: Resolve a container / pod hint for each PID from /proc/<pid>/cgroup.
    resolve_containers: bool = True
    proc_root: str = "/proc"

    @model_validator(mode="after")
    def _replay_needs_files(self) -> GpuConfig:
        if self.enabled and self.backend == "replay" and not self.replay.files:
            raise ValueError("gpu.backend is 'replay' but gpu.replay.files is empty: list the nvidia-smi CSV logs")
        return self
