"""The metric catalog: every exported family, declared once.

``entry`` is the record type; ``core``, ``gpu`` and ``drift`` hold each
component's entries; ``catalog`` joins them and renders docs/metrics.md.
"""
