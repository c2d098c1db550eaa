"""Config section ``drift:`` of the sidecar."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DriftConfig(BaseModel):
    """Drift engine settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the drift component.
        reference: path of a reference profile (``inferwatch reference build``) used for every model
            version. Without one, each model version builds a warm-up reference from its first
            ``warmup_events`` events.
        warmup_events: events per model version in a warm-up reference.
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
        max_pending_labels: predictions remembered while waiting for their label.
        label_ttl_s: a prediction waits at most this long for its label.
        checkpoint_path: file where window state is saved atomically; a restart resumes from it.
        checkpoint_interval_s: seconds between checkpoints.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    reference: str | None = None
    warmup_events: int = Field(default=5000, ge=100, le=50_000)
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
        return self
