"""Tail attribution: which stage and which inputs make the slowest requests slow (docs/tail.md)."""
