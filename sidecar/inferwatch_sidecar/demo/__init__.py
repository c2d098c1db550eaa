"""The ``inferwatch demo`` scenario, shared by the demo command and the end-to-end test.

Modules:

- :mod:`.model`: a seeded synthetic credit-decision dataset and a softmax
  regression trained on it with numpy (the stable and canary models);
- :mod:`.faults`: the fault switches, a small JSON file every model-server
  process reads;
- :mod:`.server`: the SDK-instrumented FastAPI model server (run under uvicorn);
- :mod:`.loadgen`: a bounded, loopback-only load generator that also posts
  ground-truth labels to the sidecar;
- :mod:`.promtext`: parsing ``/metrics`` and histogram quantiles;
- :mod:`.scenario`: starts the sidecar, the servers and (optionally)
  Prometheus, runs the timeline, injects the faults and judges detection;
- :mod:`.view`: the live terminal view (rich).
"""
