"""Saturation: the binding resource, engine preemptions and GPU health (docs/saturation.md). promtool:
tests/alerts/saturation.test.yml."""

from __future__ import annotations

from alerts.model import Alert, Threshold

_SAT = "job, instance, service, model, model_version"


def _saturation_alerts() -> list[Alert]:
    """The saturation verdict, the engine-neutral preemptions, and the GPU health signals (docs/saturation.md)."""
    ratio = ('{{{{ with printf "inferwatch_saturation_ratio{{instance=\'%s\',service=\'%s\',model=\'%s\','
             'model_version=\'%s\',resource=\'%s\'}}" $labels.instance $labels.service $labels.model '
             '$labels.model_version $labels.resource | query }}}} (ratio {{{{ . | first | value | '
             'humanizePercentage }}}}){{{{ end }}}}')
    return [
        Alert(
            name="InferwatchSaturated", group="inferwatch-saturation", severity="warning", for_s=900,
            expr="max by (" + _SAT + ", resource) (inferwatch_saturation_bound{{resource!=\"none\"}}) == 1",
            summary="{labels.model} version {labels.model_version} ({labels.service}) is {labels.resource}-bound.",
            description="The saturation verdict of {labels.model} version {labels.model_version} on "
                        "{labels.instance} has named {labels.resource} as the binding resource for {window:15m}"
                        + ratio + ": more load will not add throughput. The runbook says what to do for "
                        "each resource.",
        ),
        Alert(
            name="InferwatchEnginePreempting", group="inferwatch-saturation", severity="warning", for_s=300,
            expr="sum by (" + _SAT + ") (increase(inferwatch_engine_preemptions_total[{window:10m}])) > {preemptions}",
            summary="The engine serving {labels.model} ({labels.service}) preempts requests for lack of KV cache.",
            description="{value:humanize} requests of {labels.model} version {labels.model_version} were preempted "
                        "or retracted in {window:10m} (threshold {preemptions}): their KV blocks were freed and "
                        "the work is recomputed.",
            thresholds=(Threshold(name="preemptions", value=5, doc="preemptions in the window"),),
        ),
        Alert(
            name="InferwatchGPUXidError", group="inferwatch-saturation", severity="critical", for_s=0,
            expr="sum by (job, instance, gpu, xid) (increase(inferwatch_gpu_xid_errors_total[{window:10m}])) > 0",
            summary="GPU {labels.gpu} on {labels.instance} reported XID {labels.xid}.",
            description="NVML reported {value:humanize} XID {labels.xid} critical error events on GPU {labels.gpu} "
                        "in {window:10m}.",
        ),
        Alert(
            name="InferwatchGPUThrottled", group="inferwatch-saturation", severity="warning", for_s=600,
            expr="max by (job, instance, gpu, reason) (inferwatch_gpu_throttle_active{{reason=~\"{reasons}\"}}) == 1",
            summary="GPU {labels.gpu} on {labels.instance} is throttled ({labels.reason}).",
            description="NVML has reported the clock event reason {labels.reason} on GPU {labels.gpu} for "
                        "{window:10m}: the clocks are held down, so every kernel runs slower.",
            thresholds=(Threshold(name="reasons", value="sw_thermal|hw_thermal|hw_slowdown|hw_power_brake|"
                                  "sw_power_cap", doc="clock event reasons that page (thermal and power)"),),
        ),
        Alert(
            name="InferwatchEngineScrapeFailing", group="inferwatch-saturation", severity="warning", for_s=300,
            expr="max by (job, instance, target) (inferwatch_engine_up) == 0",
            summary="The sidecar on {labels.instance} cannot read engine {labels.target}'s metrics.",
            description="Scrapes of engine {labels.target} by the sidecar on {labels.instance} have failed or not "
                        "been recognised for {window:5m}; the saturation verdict of its models has no engine "
                        "inputs. /v1/status says why.",
        ),
    ]
