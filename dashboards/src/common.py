"""What every inferwatch dashboard shares: the data source, label selectors, variables and panel defaults.

Each panel function takes keyword arguments only and returns the grafana-foundation-sdk builder of that
panel type, so a dashboard can chain the SDK's typed options onto it. The defaults give every panel a unit,
thresholds that start green, a description and the ``${datasource}`` variable; thresholds drawn on a panel
come from the alert that watches the same signal (:func:`threshold`), so the picture and the page agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from grafana_foundation_sdk.builders import bargauge as bargauge_builder
from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import heatmap as heatmap_builder
from grafana_foundation_sdk.builders import prometheus, statetimeline
from grafana_foundation_sdk.builders import stat as stat_builder
from grafana_foundation_sdk.builders import timeseries as timeseries_builder
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.models import common as c
from grafana_foundation_sdk.models import dashboard as d
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from alerts import source

Row = dashboard_builder.Row
DS = d.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"

#: Regex of the profile column names that hold the confidence (the drift metrics carry no role label;
#: ``__confidence__`` is the column name of warm-up references).
CONFIDENCE_FEATURES = "__confidence__|.*conf.*|.*prob.*|score"

# Label selectors shared by the panels. Core and drift metrics both label the version ``model_version``; every
# model dashboard fills its ``version`` variable from that label, so a chosen version carries across dashboards.
CORE = 'service=~"$service", model=~"$model", model_version=~"$version"'
DRIFT = 'model=~"$model", model_version=~"$version"'
GPU = 'instance=~"$instance", gpu=~"$gpu"'
INST = 'instance=~"$instance"'

#: What a dashboard lays out in reading order: a row header or a panel. A dashboard with several rows builds
#: each in its own function returning ``list[Item]`` (one function per row of panels).
Item = Row | cog.Builder[d.Panel]

#: ``[(value, color), ...]`` steps above the base green step.
Steps = Sequence[tuple[float, str]]

UP_MAP = [d.ValueMap(options={"0": d.ValueMappingResult(text="DOWN", color="red", index=0),
                              "1": d.ValueMappingResult(text="up", color="green", index=1)})]

P = TypeVar("P", timeseries_builder.Panel, stat_builder.Panel, heatmap_builder.Panel, bargauge_builder.Panel,
            statetimeline.Panel)


def threshold(alert: str, name: str) -> float:
    """The value of threshold ``name`` of ``alert`` in ``alerts/source.py``."""
    return source.threshold(alert, name)


# ---------------------------------------------------------------------------------------------------------------
# queries
# ---------------------------------------------------------------------------------------------------------------


def target(expr: str, legend: str = "", *, exemplar: bool = False, heatmap: bool = False,
           instant: bool = False) -> prometheus.Dataquery:
    """One Prometheus query; its refId is set by the panel (A, B, ... in order)."""
    q = (prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend or "__auto")
         .format(PromQueryFormat.HEATMAP if heatmap else PromQueryFormat.TIME_SERIES))
    if exemplar:
        q = q.exemplar(True)
    if instant:
        q = q.instant()
    return q


def quantiles(metric: str, sel: str, by: str, *, exemplar: bool = False,
              qs: tuple[tuple[float, str], ...] = ((0.5, "P50"), (0.99, "P99"), (0.999, "P999")),
              ) -> list[prometheus.Dataquery]:
    """``histogram_quantile`` of ``metric`` for each quantile, grouped by ``by`` (comma-separated labels)."""
    group = f"{by}, le" if by else "le"
    prefix = "".join(f"{{{{{b.strip()}}}}} " for b in by.split(",") if b.strip())
    native = f"sum by ({by}) " if by else "sum "
    # Classic buckets where a sidecar exports them, else its native histogram (docs/scale.md): the same
    # quantile. Engines' own histograms (vllm:...) are classic only.
    return [target(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{sel}}}[{RATE}])))"
                   + (f" or histogram_quantile({q}, {native}(rate({metric}{{{sel}}}[{RATE}])))"
                      if metric.startswith("inferwatch_") else ""),
                   f"{prefix}{name}", exemplar=exemplar) for q, name in qs]


def hist_rate(metric: str, part: str, sel: str, by: str = "") -> str:
    """``sum by (by) (rate(<metric>_<part>{sel}[...]))`` for ``part`` ``sum`` or ``count``.

    From the classic series where a sidecar exports them, else from its native histogram: a Prometheus that
    ingests native histograms keeps no ``_sum`` or ``_count`` series of them (docs/scale.md).
    """
    agg = f"sum by ({by}) " if by else "sum "
    return (f"({agg}(rate({metric}_{part}{{{sel}}}[{RATE}]))\n or "
            f"{agg}(histogram_{part}(rate({metric}{{{sel}}}[{RATE}]))))")


def hist_buckets(metric: str, sel: str) -> str:
    """A heatmap's buckets per second: the classic ``le`` buckets, else the native histogram itself."""
    return f"sum by (le) (rate({metric}_bucket{{{sel}}}[{RATE}]))\nor sum(rate({metric}{{{sel}}}[{RATE}]))"


# ---------------------------------------------------------------------------------------------------------------
# panels
# ---------------------------------------------------------------------------------------------------------------


def _thresholds(steps: Steps) -> dashboard_builder.ThresholdsConfig:
    return dashboard_builder.ThresholdsConfig().mode(d.ThresholdsMode.ABSOLUTE).steps(
        [d.Threshold(value=None, color="green"), *(d.Threshold(value=v, color=color) for v, color in steps)])


def _panel(p: P, *, title: str, description: str, unit: str, targets: Sequence[prometheus.Dataquery], w: int,
           h: int, thresholds: Steps, minimum: float | None, maximum: float | None,
           mappings: Sequence[d.ValueMap]) -> P:
    """What every panel type shares; returns ``p`` for chaining."""
    p.title(title).description(description).datasource(DS).span(w).height(h)
    p.targets([t.ref_id(chr(ord("A") + i)) for i, t in enumerate(targets)])
    p.unit(unit).thresholds(_thresholds(thresholds)).mappings(list(mappings))
    if minimum is not None:
        p.min(minimum)
    if maximum is not None:
        p.max(maximum)
    return p


def _reduce_last() -> common_builder.ReduceDataOptions:
    return common_builder.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def timeseries(*, title: str, description: str, targets: Sequence[prometheus.Dataquery], unit: str = "short",
               w: int = 12, h: int = 8, thresholds: Steps = (), stack: bool = False, minimum: float | None = None,
               maximum: float | None = None, log_scale: bool = False) -> timeseries_builder.Panel:
    """A time series; thresholds are drawn as dashed lines, ``stack`` stacks the series."""
    scale = common_builder.ScaleDistributionConfig()
    scale = scale.type(c.ScaleDistribution.LOG).log(10) if log_scale else scale.type(c.ScaleDistribution.LINEAR)
    p = _panel(timeseries_builder.Panel(), title=title, description=description, unit=unit, targets=targets, w=w,
               h=h, thresholds=thresholds, minimum=minimum, maximum=maximum, mappings=())
    return (p.color_scheme(dashboard_builder.FieldColor().mode(d.FieldColorModeId.PALETTE_CLASSIC))
            .draw_style(c.GraphDrawStyle.LINE).line_width(1).fill_opacity(30 if stack else 10)
            .show_points(c.VisibilityMode.NEVER)
            .stacking(common_builder.StackingConfig().mode(c.StackingMode.NORMAL if stack else c.StackingMode.NONE)
                      .group("A"))
            .thresholds_style(common_builder.GraphThresholdsStyleConfig().mode(
                c.GraphThresholdsStyleMode.DASHED if thresholds else c.GraphThresholdsStyleMode.OFF))
            .scale_distribution(scale)
            .legend(common_builder.VizLegendOptions().display_mode(c.LegendDisplayMode.TABLE)
                    .placement(c.LegendPlacement.BOTTOM).show_legend(True).calcs(["mean", "max", "lastNotNull"]))
            .tooltip(common_builder.VizTooltipOptions().mode(c.TooltipDisplayMode.MULTI).sort(c.SortOrder.DESCENDING)))


def stat(*, title: str, description: str, targets: Sequence[prometheus.Dataquery], unit: str = "short",
         w: int = 12, h: int = 8, thresholds: Steps = ()) -> stat_builder.Panel:
    """A single value on a background colored by its thresholds."""
    p = _panel(stat_builder.Panel(), title=title, description=description, unit=unit, targets=targets, w=w, h=h,
               thresholds=thresholds, minimum=None, maximum=None, mappings=())
    return (p.color_scheme(dashboard_builder.FieldColor().mode(d.FieldColorModeId.THRESHOLDS))
            .reduce_options(_reduce_last()).color_mode(c.BigValueColorMode.BACKGROUND)
            .graph_mode(c.BigValueGraphMode.AREA).text_mode(c.BigValueTextMode.AUTO))


def heatmap(*, title: str, description: str, targets: Sequence[prometheus.Dataquery], unit: str = "short",
            w: int = 12, h: int = 8) -> heatmap_builder.Panel:
    """Pre-bucketed series (``target(..., heatmap=True)``) as a heatmap, with exemplars."""
    p = _panel(heatmap_builder.Panel(), title=title, description=description, unit=unit, targets=targets, w=w, h=h,
               thresholds=(), minimum=None, maximum=None, mappings=())
    return (p.calculate(False).y_axis(heatmap_builder.YAxisConfig().unit(unit))
            .color(heatmap_builder.HeatmapColorOptions().scheme("Oranges").mode(heatmap_model.HeatmapColorMode.SCHEME))
            .cell_gap(1).mode(c.TooltipDisplayMode.SINGLE).hide_y_histogram().exemplars_color("rgba(255,0,255,0.7)"))


def bargauge(*, title: str, description: str, targets: Sequence[prometheus.Dataquery], unit: str = "short",
             w: int = 12, h: int = 8, minimum: float | None = None,
             maximum: float | None = None) -> bargauge_builder.Panel:
    """Horizontal gradient bars of each series' last value."""
    p = _panel(bargauge_builder.Panel(), title=title, description=description, unit=unit, targets=targets, w=w,
               h=h, thresholds=(), minimum=minimum, maximum=maximum, mappings=())
    return (p.reduce_options(_reduce_last()).orientation(c.VizOrientation.HORIZONTAL)
            .display_mode(c.BarGaugeDisplayMode.GRADIENT))


def state_timeline(*, title: str, description: str, targets: Sequence[prometheus.Dataquery], unit: str = "short",
                   w: int = 12, h: int = 8, thresholds: Steps = (),
                   mappings: Sequence[d.ValueMap] = ()) -> statetimeline.Panel:
    """States over time, colored by thresholds or value mappings."""
    p = _panel(statetimeline.Panel(), title=title, description=description, unit=unit, targets=targets, w=w, h=h,
               thresholds=thresholds, minimum=None, maximum=None, mappings=mappings)
    return (p.color_scheme(dashboard_builder.FieldColor().mode(d.FieldColorModeId.THRESHOLDS))
            .show_value(c.VisibilityMode.NEVER).merge_values(True).row_height(0.9))


# ---------------------------------------------------------------------------------------------------------------
# variables and the dashboard
# ---------------------------------------------------------------------------------------------------------------


def datasource_var() -> dashboard_builder.DatasourceVariable:
    """``$datasource``: any Prometheus data source (instead of ``__inputs``, for file provisioning)."""
    return (dashboard_builder.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .multi(False).include_all(False))


def query_var(name: str, label: str, query: str, *, multi: bool = True,
              current: str | None = None) -> dashboard_builder.QueryVariable:
    """A ``label_values(...)`` variable; "All" (``.*``) unless ``current`` names a single default value."""
    v = (dashboard_builder.QueryVariable(name).label(label).datasource(DS)
         .query({"query": query, "refId": f"{name}-var"}).refresh(d.VariableRefresh.ON_TIME_RANGE_CHANGED)
         .sort(d.VariableSort.ALPHABETICAL_ASC).multi(multi).hide(d.VariableHide.DONT_HIDE))
    if current is None:
        return v.include_all(True).all_value(".*").current(
            d.VariableOption(selected=True, text=["All"], value=["$__all"]))
    return v.include_all(False).current(d.VariableOption(selected=True, text=current, value=current))


def core_vars() -> list[cog.Builder[d.VariableModel]]:
    """service, model and version from the request counter (core metrics)."""
    return [
        datasource_var(),
        query_var("service", "Service", "label_values(inferwatch_requests_total, service)"),
        query_var("model", "Model", 'label_values(inferwatch_requests_total{service=~"$service"}, model)'),
        query_var("version", "Version",
                  'label_values(inferwatch_requests_total{service=~"$service", model=~"$model"}, model_version)'),
    ]


def dashboard(*, uid: str, title: str, description: str, variables: Sequence[cog.Builder[d.VariableModel]],
              items: Sequence[Item]) -> d.Dashboard:
    """One dashboard: a stable UID, its variables and its rows and panels in reading order (laid out by the SDK).

    Panel ids are numbered in reading order, so they are stable too.
    """
    b = (dashboard_builder.Dashboard(title).uid(uid).description(description).tags(["inferwatch"])
         .timezone("browser").editable().tooltip(d.DashboardCursorSync.CROSSHAIR).version(1).refresh("30s")
         .time("now-1h", "now").fiscal_year_start_month(0).live_now(False).week_start("")
         .link(dashboard_builder.DashboardLink("inferwatch").type(d.DashboardLinkType.DASHBOARDS)
               .tags(["inferwatch"]).as_dropdown(True).include_vars(True).keep_time(True).icon("external link")
               .target_blank(False).tooltip("").url(""))
         .annotation(dashboard_builder.AnnotationQuery().name("Annotations & Alerts").built_in(1)
                     .datasource(d.DataSourceRef(type_val="grafana", uid="-- Grafana --")).enable(True).hide(True)
                     .icon_color("rgba(0, 211, 255, 1)").type("dashboard"))
         .variables(list(variables)))
    for it in items:
        b = b.with_row(it) if isinstance(it, Row) else b.with_panel(it)
    model = b.build()
    for i, p in enumerate(model.panels or [], start=1):
        p.id_val = i
    return model
