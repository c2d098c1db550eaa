"""Export: how the aggregated numbers leave the sidecar.

``routes`` is the HTTP route table (``/metrics``, health, status, JSON ingest,
admin), built from callables the daemon passes in; ``http_server`` serves it;
``otlp`` pushes the same metric families over OTLP/HTTP.
"""
