"""inferwatch sidecar: ingest, aggregation, GPU and drift monitors, exporters.

Installed with ``pip install "inferwatch[sidecar]"``. Serving code never
imports this package; it imports the SDK (``inferwatch``).
"""

__version__ = "0.1.0"
