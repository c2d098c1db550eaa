"""The sidecar's HTTP side: one server, one route table, for routes that belong to ingest, export and admin.

- :mod:`.routes`: the route table (``/metrics``, ``/healthz``, ``/readyz``, ``/v1/status``, the status page,
  ``POST /v1/events``, ``/v1/traces``, ``/v1/skew`` and ``/admin/<component>/...``), wired to the daemon
  through narrow callables only (:class:`~.routes.Endpoints`), and the ``/metrics`` rendering;
- :mod:`.server`: the uvicorn/h11 server with its connection and time limits; it never sees the daemon.

It sits above ``ingest``, ``export`` and ``config`` (the server reads ``http:``), below the daemon that wires it.
"""
