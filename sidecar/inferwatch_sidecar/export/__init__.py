"""Export: how the aggregated numbers leave the sidecar.

``http_server`` serves ``/metrics``, health, status and the admin routes;
``otlp`` pushes the same metric families over OTLP/HTTP.
"""
