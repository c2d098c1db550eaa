"""The metric catalog: every exported family, declared once.

``entry`` is the record type; ``core``, ``gpu`` and ``drift`` hold each
component's entries, one module-level name each; ``catalog`` joins them and
renders docs/metrics.md; ``families`` builds the exported prometheus_client
families from entries.
"""
