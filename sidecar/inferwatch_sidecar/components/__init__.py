"""Sidecar components: the GPU monitor (``gpu``) and the drift engine (``drift``).

``base`` is the plug-in contract the daemon drives.
"""
