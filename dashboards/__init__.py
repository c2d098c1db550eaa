"""Grafana dashboards for inferwatch: one module per dashboard in ``src/``, rendered to JSON by ``generate.py``."""
