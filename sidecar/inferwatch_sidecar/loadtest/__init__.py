"""``inferwatch loadtest``: a closed-loop concurrency sweep, a fixed-rate run, or a push until failure.

``client`` is the HTTP/1.1 keep-alive client on raw asyncio transports (callbacks, no task per request),
``payloads`` builds requests (OpenAI completions/chat, generic JSON), ``runner`` drives the steps and
measures, ``report`` prints tables, JSON and plots, ``sidecar_view`` joins each step with a sidecar's view.
"""
