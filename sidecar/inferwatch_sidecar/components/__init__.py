"""Sidecar components: the GPU monitor (``gpu``), the drift engine (``drift``), tail attribution (``tail``),
the canary judge (``canary``) and the training-serving skew join (``skew``).

``registry`` is the one list of them; ``base`` the plug-in contract the daemon drives and its declared
hooks; ``periodic`` the one skeleton every component subclasses (staging, worker, drop counters, snapshot,
``collect``); ``identity`` the (service, model, version) key and the baseline version; ``detector`` the one
contract of every detector (leak detector, per-column drift windows); ``staging`` and ``worker`` the
hand-over from the ingest thread and the periodic thread behind a component.
"""
