"""Prometheus alert and recording rules for inferwatch.

``alerts/source.py`` is the single source; ``python alerts/generate.py`` renders
the plain rule files, the Kubernetes PrometheusRule and ``docs/alerts.md``.
"""
