"""Aggregation: decoded events in, bounded counters and histograms out.

``aggregator`` keeps the numbers and builds metric families at scrape time;
``labels`` caps every label value so cardinality never depends on traffic.
"""
