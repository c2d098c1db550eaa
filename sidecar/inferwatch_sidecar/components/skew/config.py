"""Config section ``skew:`` of the sidecar (training-serving skew, docs/skew.md).

Example::

    skew:
      enabled: true
      max_ids: 50000              # served rows waiting for their offline values (and offline rows for served)
      window_rows: 1000           # match ratio over the last N joined rows of each model version
      served_dir: /var/lib/inferwatch/served   # keep a sample of the served rows as Parquet
      sample_ratio: 0.01          # share of request IDs kept there (0: none)
      max_bytes: 1073741824       # size cap of served_dir: the oldest files are deleted
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SkewConfig(BaseModel):
    """Training-serving skew settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the skew component (off by default: it holds served rows waiting for a batch job).
        max_ids: most request IDs the live join holds on each side: served rows waiting for their offline
            values, and offline rows posted before their served row arrived. The oldest go first (counted).
        max_pending_bytes: estimated bytes of the rows waiting on both sides together (their values); past it
            the oldest rows of the side that grew leave (served: ``expired{reason="max_pending_bytes"}``,
            offline: ``unmatched``). Offline rows come from an unauthenticated route, 64 values each.
        max_window_bytes: estimated bytes of the joined rows in every model version's window; past it the window
            holding most drops its oldest rows (``dropped{reason="window_full"}``).
        max_age_seconds: a served row older than this is no longer joined (counted as ``expired``).
        window_rows: the match ratio and the diagnosis cover the last ``window_rows`` joined rows of each
            model version.
        evaluate_seconds: how often the joined rows are diagnosed and the gauges refreshed.
        rtol / atol: float tolerance of a match (``|served - offline| <= atol + rtol * max(|served|, |offline|)``).
        max_models: model versions tracked at once.
        max_features: features compared per model version.
        max_staged: events waiting for the component's thread; beyond it events are dropped and counted.
        max_offline_rows_per_post: rows one ``POST /v1/skew`` may carry.
        served_dir: folder for the sample of served rows (rotating Parquet files); None keeps none.
        sample_ratio: share of request IDs whose served rows are written (chosen by a hash of the ID, so
            every replica keeps the same IDs); 0 writes none, at most ``max_sample_ratio``.
        max_sample_ratio: the most ``sample_ratio`` may be: the served sample is a bounded share, raised
            knowingly.
        file_max_bytes: a file is closed and a new one started past this size.
        rotate_seconds: or past this age.
        max_bytes: size cap of ``served_dir``; the oldest files are deleted to stay under it (their rows counted).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    max_ids: int = Field(default=50_000, ge=10, le=5_000_000)
    max_pending_bytes: int = Field(default=16 << 20, ge=1 << 16)
    max_window_bytes: int = Field(default=16 << 20, ge=1 << 16)
    max_age_seconds: float = Field(default=3600.0, gt=0)
    window_rows: int = Field(default=1000, ge=10, le=100_000)
    evaluate_seconds: float = Field(default=10.0, gt=0)
    rtol: float = Field(default=1e-6, ge=0)
    atol: float = Field(default=1e-9, ge=0)
    max_models: int = Field(default=16, ge=1, le=1000)
    max_features: int = Field(default=64, ge=1, le=1024)
    max_staged: int = Field(default=200_000, ge=1000)
    max_offline_rows_per_post: int = Field(default=10_000, ge=1)
    served_dir: str | None = None
    sample_ratio: float = Field(default=0.0, ge=0, le=1)
    max_sample_ratio: float = Field(default=0.1, gt=0, le=1)
    file_max_bytes: int = Field(default=64 << 20, ge=4096)
    rotate_seconds: float = Field(default=300.0, gt=0)
    max_bytes: int = Field(default=1 << 30, ge=4096)

    @model_validator(mode="after")
    def _check(self) -> SkewConfig:
        if self.sample_ratio > self.max_sample_ratio:
            raise ValueError(f"skew.sample_ratio {self.sample_ratio} is above skew.max_sample_ratio "
                             f"{self.max_sample_ratio}: the served sample is a bounded share; raise both knowingly")
        if self.sample_ratio > 0 and not self.served_dir:
            raise ValueError("skew.sample_ratio > 0 needs skew.served_dir: the folder the served rows go to")
        if self.file_max_bytes > self.max_bytes:
            raise ValueError("skew.file_max_bytes must not exceed skew.max_bytes")
        return self
