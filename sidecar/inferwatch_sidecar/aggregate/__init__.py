"""Aggregation: decoded events in, bounded counters and histograms out.

``aggregator`` keeps the numbers (its histogram state in ``histograms``) and builds metric families at
scrape time (``scrape``); ``latency_status`` turns them into ``/v1/status``'s windowed quantiles;
``labels`` caps every label value so cardinality never depends on traffic.
"""
