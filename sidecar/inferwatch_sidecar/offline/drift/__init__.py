"""Offline drift tools: data file readers and the HTML deep-dive report."""
