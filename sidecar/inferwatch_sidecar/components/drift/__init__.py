"""Drift engine: reference profiles, streaming windows, statistical tests."""
