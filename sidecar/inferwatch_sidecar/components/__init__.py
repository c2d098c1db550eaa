"""Sidecar components: the GPU monitor (``gpu``) and the drift engine (``drift``).

``base`` is the plug-in contract the daemon drives, ``detector`` the one contract
of every detector (leak detector, per-column drift windows), and ``worker`` the
periodic thread behind a component.
"""
