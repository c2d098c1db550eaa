"""Sidecar components: the GPU monitor (``gpu``), the drift engine (``drift``), tail attribution (``tail``)
and the canary judge (``canary``).

``base`` is the plug-in contract the daemon drives, ``detector`` the one contract
of every detector (leak detector, per-column drift windows), and ``worker`` the
periodic thread behind a component.
"""
