"""Capacity: the knee of throughput against concurrency, from a load test or from live traffic.

``knee`` fits the knee (shared by ``inferwatch loadtest`` and the live table), ``table`` keeps, per model
version, latency by the number of requests in flight at arrival.
"""
