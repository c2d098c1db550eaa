"""Export: how the aggregated numbers leave the sidecar.

``otlp`` pushes the metric families over OTLP/HTTP; ``budget`` caps the series
``/metrics`` shows; ``summary`` and ``live_view`` say what is bad now (the status
page, ``inferwatch top``). The HTTP route table and server are ``inferwatch_sidecar.http``.
"""
