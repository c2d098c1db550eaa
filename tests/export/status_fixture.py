"""A ``/v1/status`` document where every component has something bad now, for the summary, the page and ``top``.

Saturation, headroom and a retry storm with a timeout mismatch included, each since when the component says
(saturation, canary, drift window, GPU) or since first seen (headroom, the request verdicts).

Built the way the daemon builds one (:func:`inferwatch_sidecar.export.summary.verdicts` fills its
``summary``), with outcomes the wire format may add (``client_error``, ``shed``) besides ok, error and
cancelled, and names long enough to overflow a careless layout.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from inferwatch_sidecar.components.registry import verdict_readers
from inferwatch_sidecar.export.summary import SinceTracker, verdicts

GiB = 2**30
#: The document's time: this run's start, so that "since ... (7.0 min ago)" reads as it would live.
NOW = float(int(time.time()))
#: Requests in the window by outcome, per label set.
OUTCOMES = {
    ("ranker", "v1"): {"ok": 900, "error": 60, "cancelled": 15, "client_error": 20, "shed": 5},
    ("ranker", "v2"): {"ok": 190, "error": 4, "cancelled": 6, "client_error": 0, "shed": 0},
}
LONG_MODEL = "a-model-with-a-very-long-name-from-the-traffic-that-must-wrap-not-cut"
#: HTTP attempts, retries, give-ups and the give-up wait's median in the window, per label set: v1 in a retry
#: storm (2 attempts per unique request, 15% given up) whose clients also give up after 25 ms against the
#: server's 40 ms median (a timeout mismatch as well), v2 retried a little (no verdict).
HTTP = {
    ("ranker", "v1"): {"attempts": 2000, "retries": 1000, "giveups": 300, "giveup_wait_p50_s": 0.025},
    ("ranker", "v2"): {"attempts": 200, "retries": 10, "giveups": 1, "giveup_wait_p50_s": 30.0},
}
#: When each component's own onset was, seconds before NOW.
SATURATED_FOR_S = 1500.0
CANARY_FAILING_FOR_S = 240.0
DRIFT_WINDOW_S = 3600.0
#: The canary judgement's warning (the stable version's replicas are the busier ones here).
CANARY_WARNING = ("load per replica differs 2.50x (stable 500 requests on 2 replica(s), canary 200 on 1): the stable "
                  "version's replicas carry more load each, which alone can make it slower; compare latency with care")


def _latency_row(model: str, version: str, p99: float) -> dict[str, Any]:
    out = OUTCOMES.get((model, version), {"ok": 40, "error": 0, "cancelled": 0})
    n = sum(out.values())
    row = {"count": n, "total": n * 3, "mean_s": p99 / 4, "p50_s": p99 / 5, "p90_s": p99 / 2, "p99_s": p99}
    out_row = {"service": "svc", "model": model, "model_version": version, "request": row,
               "stages": {"queue": dict(row), "inference": dict(row)}, "outcomes": dict(out),
               "outcomes_total": {k: 3 * v for k, v in out.items()}}
    if (model, version) in HTTP:
        out_row["http"] = dict(HTTP[(model, version)])
    return out_row


def _metric(name: str, stage: str | None, result: str, base: float, can: float, effect: float, tol: float,
            p: float | None) -> dict[str, Any]:
    from inferwatch_sidecar.components.canary.judge import STATISTICS

    statistic, unit = STATISTICS[name]
    return {"name": name, "stage": stage, "direction": "increase", "baseline": base, "canary": can,
            "effect_name": "auc_shift" if "latency" in name else "psi", "effect": effect, "tolerance": tol,
            "p_value": p, "p_adjusted": p, "critical": name == "error_rate", "result": result, "statistic": statistic,
            "unit": unit}


def status() -> dict[str, Any]:
    """The document (a fresh copy each call)."""
    leak = {"verdict": "leak", "rate_bytes_per_s": 64 * 2**20, "time_to_oom_s": 671.0, "detected_at": NOW - 420}
    metrics = [
        _metric("latency", None, "fail", 0.012, 0.041, 0.42, 0.05, 1e-9),
        _metric("stage_latency", "queue", "fail", 0.002, 0.030, 0.47, 0.05, 1e-12),
        _metric("stage_latency", "inference", "fail", 0.010, 0.011, 0.08, 0.05, 0.003),
        _metric("stage_latency", "postprocess", "pass", 0.001, 0.001, 0.0, 0.05, 0.8),
        _metric("prediction_mix", None, "fail", 0.0, 0.0, 0.31, 0.1, 1e-6),
        _metric("error_rate", None, "pass", 0.004, 0.02, 0.016, 0.02, 0.2),
    ]
    reasons = [f"{m['name']}{'[' + m['stage'] + ']' if m['stage'] else ''}: {m['effect_name']} {m['effect']:.4g} beyond "
               f"tolerance {m['tolerance']:.4g} (stable {m['baseline']:.4g}, canary {m['canary']:.4g}, adjusted "
               f"p={m['p_adjusted']:.2g})" for m in metrics if m["result"] == "fail"]
    drift_model = {
        "model": "ranker", "version": "v1",
        "reference": {"source": "file", "events": 5000, "warmup_target": None},
        "window": {"events": 2000, "seconds": DRIFT_WINDOW_S},
        "labels": {"matched": 400, "unmatched": 0},
        "labelled": {"events": 400, "accuracy": 0.363},
        "performance": {"calibrated": True, "method": "isotonic", "estimated_accuracy": 0.64,
                        "estimated_accuracy_interval": [0.58, 0.70], "reference_accuracy": 0.865, "rows": 2000},
        "dataset_drift": True, "share_drifted": 0.67, "multivariate": None,
        "features": [
            {"feature": f, "role": "feature", "test": "ks", "statistic": 0.31, "p_value": 1e-9, "p_adjusted": 1e-8,
             "effect_name": "wasserstein_norm", "effect": 1.2, "drifted": True, "status": "ok", "n_current": 2000,
             "missing_current": 0.0, "unseen": 0}
            for f in ("income", "age", "tenure_days_since_first_purchase_in_the_store")
        ] + [{"feature": "prediction", "role": "prediction", "test": "chi2", "statistic": 40.0, "p_value": 1e-6,
              "p_adjusted": 1e-5, "effect_name": "psi", "effect": 0.3, "drifted": True, "status": "ok",
              "n_current": 2000, "missing_current": 0.0, "unseen": 0}],
        "canary": None,
    }
    canary_model = {**copy.deepcopy(drift_model), "version": "v2", "dataset_drift": False, "share_drifted": 0.0,
                    "labelled": {"events": 0, "accuracy": None},
                    "performance": {"calibrated": True, "method": "isotonic", "estimated_accuracy": 0.90,
                                    "estimated_accuracy_interval": [0.87, 0.93], "reference_accuracy": 0.865,
                                    "rows": 400},
                    "features": [], "canary": {"baseline_version": "v1", "share_drifted": 0.25,
                                               "drifted": ["prediction"]}}
    doc: dict[str, Any] = {
        "service": "inferwatch-sidecar", "version": "0.1.0", "ready": True, "uptime_s": 900.0,
        "started_unix": NOW - 900,
        "ingest": {"frames": 100, "events": 5000, "bytes": 10**6, "lost_frames": 0, "sdk_dropped": {"buffer_full": 12},
                   "dropped": {}, "decode_errors": {}, "rates": {"events_per_s_10s": 55.5}},
        "producers": {"connected": 3, "known": 3, "table": []},
        "latency": {"window_s": 60.0, "quantiles": [0.5, 0.9, 0.99], "label_sets": 3,
                    "models": [_latency_row("ranker", "v1", 0.2), _latency_row("ranker", "v2", 0.4),
                               _latency_row(LONG_MODEL, "v1", 0.01)]},
        "components": {
            "gpu": {"state": "ok", "backend": "fake", "samples": 400, "interval_s": 1.0,
                    "devices": [{"gpu": 0, "name": "Fake H100", "total_bytes": 80 * GiB, "used_bytes": 30 * GiB,
                                 "per_process_memory": True, "leak": {"verdict": "no_leak"},
                                 "processes": [{"pid": 4242, "container": "worker-1", "used_bytes": 9 * GiB,
                                                "kind": "steady", "series": "nvml", **leak},
                                               {"pid": 4343, "container": "worker-2", "used_bytes": 4 * GiB,
                                                "verdict": "no_leak", "series": "nvml"}]}],
                    "leaks": [{"gpu": 0, "pid": 4242, "kind": "steady", "rate_bytes_per_s": 64 * 2**20,
                               "time_to_oom_s": 671.0, "detected_at": NOW - 420}],
                    "duplicate_model_copies": [{"gpu": 0, "pids": [4343, 4444], "used_bytes": [4 * GiB, 4 * GiB],
                                                "copy_bytes": 4 * GiB, "extra_bytes": 4 * GiB, "since": NOW - 3000,
                                                "fix": "load the model once (gunicorn --preload)"}],
                    "episodes": [], "faults": [], "allocator": []},
            "drift": {"state": "running", "last_evaluation_unix": NOW - 30, "models": [drift_model, canary_model]},
            "tail": {"state": "running", "window_seconds": 30, "models": [
                {"service": "svc", "model": "ranker", "version": "v1", "requests": 1500, "tails": {
                    "p99": {"status": "ok", "share": 0.01, "requests": 15, "threshold_s": 2.9, "latency_s": 3.2,
                            "culprit": "queue", "summary": "queue is 94% of the slowest 1%'s extra time; their "
                                                           "input_tokens are larger",
                            "stages": [{"stage": "queue", "seconds": 3.0, "median_seconds": 0.002,
                                        "excess_share": 0.94},
                                       {"stage": "inference", "seconds": 0.2, "median_seconds": 0.01,
                                        "excess_share": 0.06}],
                            "features": [{"feature": "input_tokens", "distinguishes": True}]},
                    "p99.9": {"status": "insufficient_data", "requests": 1, "needed_requests": 5000}}}]},
            "canary": {"state": "running", "min_requests": 100, "judgements": [
                {"service": "svc", "model": "ranker", "canary_version": "v2", "baseline_version": "v1",
                 "canary_requests": 200, "baseline_requests": 1000, "score": 35.0, "verdict": "fail",
                 "verdict_since_unix": NOW - CANARY_FAILING_FOR_S, "reasons": reasons, "metrics": metrics,
                 "warnings": [CANARY_WARNING]}]},
            # Components that list their own bad-now rows (saturation with its own onset; headroom without one).
            "saturation": {"state": "running", "models": [
                {"service": "svc", "model": "ranker", "model_version": "v1", "bound": "kv_cache",
                 "since_s": SATURATED_FOR_S, "sentence": "bound by the KV cache (92% used, 14 waiting)"}],
                "verdicts": [{"subject": "svc/ranker/v1", "verdict": "kv_cache-bound", "severity": "warn",
                              "detail": "bound by the KV cache (92% used, 14 waiting)", "alert": "InferwatchSaturated",
                              "since_unix": NOW - SATURATED_FOR_S}]},
            "capacity": {"state": "running", "staged": 0, "dropped": {}, "models": {
                f"svc/{LONG_MODEL}/v1": {"levels": 12, "windows": 40, "in_flight": 30.5, "knee": 32.0, "knee_low": 28.0,
                                         "knee_high": 36.0, "max_throughput_rps": 410.0, "headroom": 0.047}},
                "verdicts": [{"subject": f"svc/{LONG_MODEL}/v1", "verdict": "at its knee", "severity": "warn",
                              "alert": "InferwatchCapacityHeadroomLow",
                              "detail": "30.5 in flight against a live knee of 32.0 (headroom 5%, under 10%): more "
                                        "load only adds queueing"}]},
        },
        "otlp": {"state": "disabled"}, "traces": {"enabled": False},
    }
    found = verdicts(doc, verdict_readers(), NOW)
    SinceTracker().update(found, NOW - 60)
    doc["summary"] = {"verdicts": found, "evaluated_unix": NOW}
    return doc
