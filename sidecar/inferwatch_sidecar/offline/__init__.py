"""Offline-only tools: what the CLI runs over files, never the live sidecar (issue 23).

``offline.drift`` reads training and serving data files and writes the HTML deep-dive report;
``offline.gpu`` is ``inferwatch gpu analyze``: recorded logs replayed through the live detector, and plots.
The daemon never imports this package.
"""
