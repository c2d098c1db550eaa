"""Config section ``gpu:`` of the sidecar.

Example::

    gpu:
      backend: auto          # auto | nvml | fake | replay
      interval_s: 1.0
      detector:
        scales: [[900, 10], [1800, 15], [3600, 30], [7200, 60], [14400, 120]]
      fake:                  # only with backend: fake (demo, end-to-end tests)
        devices: 1
        total_gib: 80
        processes: [{pid: 4242, base_gib: 20, leak_mib_per_s: 2, leak_start_s: 60}]
      replay:                # only with backend: replay
        files: [gpu.csv, apps.csv]
      duplicates:            # duplicated model copies (one model loaded by several workers)
        min_bytes: 1073741824
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class DetectorConfig(BaseModel):
    """Leak detector settings (docs/gpu.md explains the design and derives the defaults).

    Attributes:
        scales: ``(window_s, bin_s)`` pairs: each scale judges the release floor over
            ``window_s`` seconds, from per-bin minima of ``bin_s`` seconds. A short window
            catches fast leaks quickly, a long one slow leaks. Every window must hold 16 to
            1000 bins.
        min_blocks: a window is judged only when it holds at least this many floor blocks
            (each block spans at least one release of the allocator's sawtooth), so a
            sawtooth slower than ``window_s / min_blocks`` leaves that window to longer ones.
        release_max_s: intervals between releases longer than this are level changes
            (busy/idle swings), not the sawtooth's period.
        min_rate_bytes_per_s: the lower bound of the rate's interval must exceed this
            (default 16 MiB/h): slower growth is not worth paging anyone for.
        z: the de-stepped floor's Theil-Sen slope must exceed this many times its spread under the
            background (the larger of the independent-blocks standard error and the spread of the
            series' own window slopes, measured on its falling windows).
        step_k: a block-to-block floor change further than this many robust SDs from the
            typical change is a level shift (model load, busy/idle), removed before the tests.
        max_quarter_share: no quarter of the window may carry more than this share of the
            floor's rise (plus two SDs of block noise): a rise concentrated in time is a step
            or a fill, not a creep.
        decel: the floor's slope at the end of a quadratic fit over the window and half a window
            before must be at least this share of its slope at the start (a warm-up decelerates
            towards its plateau; a leak does not).
        warmup_s: an optional blind period at the start of each series. 0 (default): warm-up
            plateaus are recognised from the data by ``decel``.
        confirm_s: the leak conditions must hold this long before the verdict flips.
        clear_s: and must fail this long before it flips back (a drop of the floor back
            towards where the leak started clears at once).
        confidence: two-sided level of the rate's interval.
        max_episodes: leak episodes remembered per series (the oldest is dropped).
        method: ``glr`` (default: one generalized likelihood-ratio test of a hinge creep against
            steps and a saturating warm-up, on floors sampled at each release, its threshold from a
            Monte Carlo; ``components/gpu/glr.py``) or ``trend`` (the earlier slope test with its shape
            conditions and a 22.5-minute blind period).
        tau_max_s: ``glr`` only: the prior on warm-ups: a leak-free warm-up's slope decays at least as
            fast as ``exp(-t / tau_max_s)`` from the series' start.
        load_warmups: ``glr`` only: a level shift of at least 256 MiB is a load (a second model, a swap)
            whose own warm-up is in the null for 10 ``tau_max_s``. A process that loads models keeps quiet;
            a leak that starts within about ``tau_max_s`` of a load, or of a traffic burst refilling the
            cache by that much, is found about ``tau_max_s`` later. False suits one model per process with
            busy/idle swings.
    """

    model_config = ConfigDict(extra="forbid")

    scales: list[tuple[float, float]] = Field(default_factory=lambda: [
        (900.0, 10.0), (1800.0, 15.0), (3600.0, 30.0), (7200.0, 60.0), (14400.0, 120.0)])
    min_blocks: int = Field(5, ge=4, le=60)
    release_max_s: float = Field(900.0, gt=0)
    min_rate_bytes_per_s: float = Field(16 * 2**20 / 3600, ge=0)
    z: float = Field(4.75, gt=0)
    step_k: float = Field(5.0, gt=0)
    max_quarter_share: float = Field(0.6, gt=0.25, le=1)
    decel: float = Field(0.6, ge=0, le=1)
    confirm_s: float = Field(60.0, ge=0)
    warmup_s: float = Field(0.0, ge=0)
    clear_s: float = Field(300.0, ge=0)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    max_episodes: int = Field(16, ge=1, le=1000)
    method: Literal["trend", "glr"] = "glr"
    tau_max_s: float = Field(1200.0, gt=0)
    load_warmups: bool = True

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

    def scale_warning(self) -> str | None:
        """A sentence for the log when the ``glr`` warm-up prior is far longer than every window, else None.

        The prior lets a series' first ``tau_max_s`` or so be a warm-up, so with windows of seconds (a demo, a
        test) and the default 20-minute prior a leak from the series' start stays a "warm-up" for minutes.
        """
        longest = max(w for w, _ in self.scales)
        if self.method != "glr" or self.tau_max_s <= 10 * longest:
            return None
        return (f"gpu.detector.tau_max_s is {self.tau_max_s:g} s, {self.tau_max_s / longest:.0f}x the longest "
                f"window ({longest:g} s): a leak that starts with a series is taken for a warm-up for about "
                f"{self.tau_max_s:g} s; set tau_max_s near the windows' scale (docs/gpu.md)")


class DuplicatesConfig(BaseModel):
    """When several processes on one GPU hold copies of one model (docs/gpu.md, "Duplicated model copies").

    A set of copies is at least ``min_copies`` processes on one GPU, each holding at least ``min_bytes``,
    all within ``similarity`` of each other (largest minus smallest, over the largest), each flat: over
    the last ``flat_s`` seconds, which it must have been seen for, its range (highest minus lowest
    sample) stayed under ``flat_ratio`` of its highest. A loading or leaking worker is not flat; a
    sawtooth of the caching allocator wider than ``flat_ratio`` hides a copy until the worker idles.

    Attributes:
        min_copies: fewest processes that make a set.
        min_bytes: each copy holds at least this much device memory.
        similarity: the copies' sizes differ by at most this share of the largest.
        flat_s: the window over which each copy must be flat.
        flat_ratio: a copy's range over ``flat_s``, over its highest sample, stays below this.
    """

    model_config = ConfigDict(extra="forbid")

    min_copies: int = Field(2, ge=2, le=1024)
    min_bytes: float = Field(float(2**30), gt=0)
    similarity: float = Field(0.10, gt=0, lt=1)
    flat_s: float = Field(300.0, gt=0)
    flat_ratio: float = Field(0.05, gt=0, lt=1)


class FakeProcess(BaseModel):
    """One scripted process on every fake device.

    Attributes:
        pid: the process ID the fake NVML reports.
        base_gib: device memory the process holds from the start.
        leak_mib_per_s: growth of that memory per second once the leak starts (0: no leak).
        leak_start_s: seconds after start-up when the leak starts.
        noise_mib: standard deviation of the Gaussian noise added to every sample.
    """

    model_config = ConfigDict(extra="forbid")

    pid: int = Field(ge=1)
    base_gib: float = Field(4.0, ge=0)
    leak_mib_per_s: float = Field(0.0, ge=0)
    leak_start_s: float = Field(0.0, ge=0)
    noise_mib: float = Field(0.0, ge=0)


class FakeConfig(BaseModel):
    """A scripted fake NVML for demos and end-to-end tests (never for production).

    Attributes:
        devices: fake GPUs, each running every process of ``processes``.
        total_gib: device memory of each fake GPU.
        processes: the scripted processes.
        leak_mib_per_s / leak_start_s / base_gib: of the shortcut process given by ``pid`` (see ``FakeProcess``).
        seed: seed of the samples' noise, so a run is reproducible.
    """

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
    """Replay recorded nvidia-smi CSV logs as if they were live.

    Attributes:
        files: the nvidia-smi CSV logs (device and per-process queries), replayed at their own timestamps.
    """

    model_config = ConfigDict(extra="forbid")

    files: list[str] = Field(default_factory=list)
    #: Start over at the end of the log (demo); otherwise the replay stops there.
    loop: bool = False


class GpuConfig(BaseModel):
    """GPU monitor settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the GPU component.
        backend: ``auto`` samples NVML when nvidia-ml-py and a driver are there and reports the GPU absent
            otherwise; ``nvml`` makes a missing NVML a reported fault; ``fake`` runs the scripted ``fake``
            devices; ``replay`` replays the ``replay`` logs.
        interval_s: seconds between NVML samples.
        detector: the leak detector.
        fake: the scripted fake NVML (``backend: fake``).
        replay: the recorded logs (``backend: replay``).
        duplicates: duplicated model copies across processes.
        proc_root: where ``/proc`` is read from, for each PID's container hint (a mounted host ``/proc``).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    backend: str = Field("auto", pattern="^(auto|nvml|fake|replay)$")
    interval_s: float = Field(1.0, ge=0.01, le=3600)
    detector: DetectorConfig = Field(default_factory=DetectorConfig)
    fake: FakeConfig = Field(default_factory=FakeConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    duplicates: DuplicatesConfig = Field(default_factory=DuplicatesConfig)
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
