"""Ingest: where events enter the sidecar.

``sockets`` reads SDK datagrams from the Unix (and optional UDP) socket,
``http_json`` decodes ``POST /v1/events`` bodies, and ``pipeline`` decodes
wire frames and hands each event to the aggregator and to the components
that asked for it.
"""
