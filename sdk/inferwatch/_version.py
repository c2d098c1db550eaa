"""The SDK version, sent in HELLO records (kept in sync with pyproject.toml)."""

__version__ = "0.1.0"
