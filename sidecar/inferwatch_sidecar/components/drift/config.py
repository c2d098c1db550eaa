"""Config section ``drift:`` of the sidecar."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DriftConfig(BaseModel):
    """Drift engine settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the drift component.
        reference: path of a reference profile (``inferwatch reference build``) used for every model
            version. Without one, each model version builds a warm-up reference from its first
            ``warmup_events`` events.
        warmup_events: events per model version in a warm-up reference.
        reference_mode: what a window is compared with. ``file``: the ``reference`` profile; ``warmup``: the
            model version's warm-up reference; ``rolling``: the same bins one ``rolling_period_s`` earlier
            (:mod:`.rolling`), the bins coming from ``reference`` when set, else from a warm-up. Default:
            ``file`` when ``reference`` is set, else ``warmup``.
        rolling_period_s: in rolling mode, how far back the compared window is (a day; a week for weekly
            seasons). At least twice ``window_seconds``.
        rolling_slots: in rolling mode, history slots per period (40 min each by default). Memory per numeric
            column: about ``(rolling_slots + 2) x 96`` bytes (3.6 KB by default) on top of its window.
        multivariate: test joint drift (:mod:`.multivariate`) where the reference has a joint model; warm-up
            references fit one.
        multivariate_effect_floor: minimum AUC shift of the joint test.
        window_seconds: length of the sliding window in seconds (time-based windows).
        window_events: when set, the window is the last ``window_events`` events instead.
        subwindows: the window is a ring of this many sub-window summaries; it slides by one of them.
        evaluate_interval_s: seconds between evaluations (off the ingest thread).
        alpha: false-discovery rate (Benjamini-Hochberg across the tests of one window).
        correction: "bh" or "none".
        numeric_effect_floor: minimum normalized Wasserstein distance for a numeric drift.
        categorical_effect_floor: minimum PSI for a categorical drift.
        missing_floor: minimum absolute change of a missing rate.
        min_samples: windows with fewer values per feature are reported but never flagged.
        drift_share: share of drifted features that makes the dataset drifted.
        bins / top_k: warm-up profile resolution (percentile bins, categories kept).
        max_models: model versions tracked at once (others are dropped and counted).
        max_features: features per model version taken from traffic during a warm-up.
        max_staged: records waiting for the evaluator thread; beyond it records are dropped and counted.
        max_staged_bytes: estimated bytes of the staged records (an upper bound from their feature
            counts); beyond it records are dropped and counted as ``staging_full``. Past half of it the
            evaluator thread drains at once rather than at its next tick.
        max_warmup_bytes: estimated bytes of raw warm-up values over all model versions; each version
            gets ``max_warmup_bytes / max_models`` and its warm-up ends early (with fewer rows) when its
            share is spent.
        max_pending_labels: predictions remembered while waiting for their label.
        label_ttl_s: a prediction waits at most this long for its label.
        checkpoint_path: file where window state is saved atomically; a restart resumes from it.
        checkpoint_interval_s: seconds between checkpoints.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    reference: str | None = None
    warmup_events: int = Field(default=5000, ge=100, le=50_000)
    reference_mode: Literal["file", "warmup", "rolling"] | None = None
    rolling_period_s: float = Field(default=86_400.0, gt=0)
    rolling_slots: int = Field(default=36, ge=2, le=288)
    multivariate: bool = True
    multivariate_effect_floor: float = Field(default=0.02, ge=0, lt=0.5)
    window_seconds: float = Field(default=600.0, gt=0)
    window_events: int | None = Field(default=None, ge=10)
    subwindows: int = Field(default=10, ge=2, le=60)
    evaluate_interval_s: float = Field(default=5.0, gt=0, le=3600)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    correction: str = Field(default="bh", pattern="^(bh|none)$")
    numeric_effect_floor: float = Field(default=0.1, ge=0)
    categorical_effect_floor: float = Field(default=0.1, ge=0)
    missing_floor: float = Field(default=0.02, ge=0, le=1)
    min_samples: int = Field(default=100, ge=1)
    drift_share: float = Field(default=0.5, gt=0, le=1)
    bins: int = Field(default=100, ge=10, le=200)
    top_k: int = Field(default=32, ge=1, le=256)
    max_models: int = Field(default=16, ge=1, le=1000)
    max_features: int = Field(default=64, ge=1, le=256)
    max_staged: int = Field(default=200_000, ge=1000)
    max_staged_bytes: int = Field(default=8 << 20, ge=1 << 20)
    max_warmup_bytes: int = Field(default=32 << 20, ge=1 << 20)
    max_pending_labels: int = Field(default=100_000, ge=0)
    label_ttl_s: float = Field(default=3600.0, gt=0)
    checkpoint_path: str | None = None
    checkpoint_interval_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> DriftConfig:
        if self.bins % 10:
            raise ValueError("drift.bins must be a multiple of 10 (PSI uses reference deciles)")
        if self.window_events is not None and self.window_events < self.subwindows:
            raise ValueError("drift.window_events must be at least drift.subwindows")
        if self.reference_mode is None:
            self.reference_mode = "file" if self.reference else "warmup"
        if self.reference_mode == "file" and not self.reference:
            raise ValueError("drift.reference_mode: file needs drift.reference (a profile file)")
        if self.reference_mode == "warmup" and self.reference:
            raise ValueError("drift.reference_mode: warmup builds its reference from traffic; remove drift.reference "
                             "or use reference_mode: file")
        if self.reference_mode == "rolling":
            if self.window_events is not None:
                raise ValueError("drift.reference_mode: rolling compares time windows; unset drift.window_events")
            if self.rolling_period_s < 2 * self.window_seconds:
                raise ValueError("drift.rolling_period_s must be at least twice drift.window_seconds")
            if self.rolling_period_s / self.rolling_slots < self.window_seconds / self.subwindows:
                raise ValueError("drift.rolling_slots: a history slot (rolling_period_s / rolling_slots) must be "
                                 "at least one sub-window (window_seconds / subwindows)")
        return self
