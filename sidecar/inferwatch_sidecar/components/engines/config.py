"""Config section ``engines:`` of the sidecar (the engine's own state, docs/saturation.md).

Example::

    engines:
      interval_s: 1.0
      targets:
        - url: http://127.0.0.1:8000/metrics     # vLLM
          service: chat
          model_version: "2026-05"
        - url: http://127.0.0.1:8002/metrics     # Triton
          kind: triton
          service: vision

``--engine-metrics URL`` (repeatable) adds a target with the defaults.
"""

from __future__ import annotations

import urllib.parse
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class EngineTarget(BaseModel):
    """One engine metrics endpoint.

    Attributes:
        url: the engine's Prometheus endpoint (http or https).
        name: the ``target`` label; defaults to host:port.
        kind: ``auto`` recognises the engine from its series names; or vllm, sglang, triton, tensorrt_llm.
        service: the ``service`` label of the neutral series (the engine has no such notion).
        model: the ``model`` label; empty takes the engine's own model label (at most ``max_models``).
        model_version: the ``model_version`` label.
        cpu_cores: cores the serving process may use, for the host_cpu saturation ratio (a Python
            event loop or tokenizer thread saturates at 1 core however many the host has).
        gpus: NVML indexes ("0", "0/mig1") this engine runs on, for the saturation verdict; empty: all.
    """

    model_config = ConfigDict(extra="forbid")

    url: str
    name: str = ""
    kind: Literal["auto", "vllm", "sglang", "triton", "tensorrt_llm"] = "auto"
    service: str = Field("", max_length=128)
    model: str = Field("", max_length=128)
    model_version: str = Field("", max_length=128)
    cpu_cores: float = Field(1.0, gt=0, le=1024)
    gpus: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        p = urllib.parse.urlsplit(v)
        if p.scheme not in ("http", "https") or not p.hostname:
            raise ValueError(f"must be an http(s) URL such as http://127.0.0.1:8000/metrics, got {v!r}")
        return v

    @model_validator(mode="after")
    def _default_name(self) -> EngineTarget:
        if not self.name:
            p = urllib.parse.urlsplit(self.url)
            self.name = f"{p.hostname}:{p.port}" if p.port else str(p.hostname)
        return self


class EnginesConfig(BaseModel):
    """Engine scraping. The component is built when at least one target is configured.

    Attributes:
        enabled: build the component (only does anything with targets).
        interval_s: seconds between scrapes of every target.
        timeout_s: a scrape that takes longer is counted as ``timeout``.
        max_body_bytes: a larger body is counted as ``too_large`` and not parsed.
        max_models: engine models kept per target when ``model`` is not set.
        targets: the endpoints.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    interval_s: float = Field(1.0, ge=0.1, le=3600)
    timeout_s: float = Field(2.0, gt=0, le=60)
    max_body_bytes: int = Field(8 << 20, ge=1024, le=256 << 20)
    max_models: int = Field(16, ge=1, le=1000)
    targets: list[EngineTarget] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _unique_names(self) -> EnginesConfig:
        names = [t.name for t in self.targets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"engine target names must be unique; set name: on the targets named {dup}")
        return self
