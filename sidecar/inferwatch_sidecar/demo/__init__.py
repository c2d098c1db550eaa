"""The ``inferwatch demo`` scenario, shared by the demo command and the end-to-end test.

What runs in the model servers:

- :mod:`.model`: a seeded synthetic credit-decision dataset and a softmax
  regression trained on it with numpy (the stable and canary models);
- :mod:`.faults`: the fault switches, a small JSON file every model-server
  process reads;
- :mod:`.allocator`: the simulated caching allocator behind the SDK's allocator probe;
- :mod:`.server`: the SDK-instrumented FastAPI model server (run under uvicorn);
- :mod:`.triton_server`: the PyTriton model server of ``--engine triton``
  (traced to the sidecar; run with PyTriton's own Python).
- :mod:`.tiny_llm`: the tiny offline Llama ``--engine vllm`` serves (written with vLLM's Python).

What runs in the demo process, in the order of a run:

- :mod:`.config`: the scenario's knobs and the faults it knows;
- :mod:`.supervise`: starting, awaiting and stopping the model servers and the sidecar;
- :mod:`.prom`: Prometheus with the fast alert rules (optional);
- :mod:`.alertmanager`: Alertmanager behind it with a fast copy of
  ``alerts/alertmanager.yml``, and the webhook receiver (optional);
- :mod:`.loadgen`: a bounded, loopback-only load generator that also posts
  ground-truth labels to the sidecar;
- :mod:`.inject`: switching the faults on, and each fault's record;
- :mod:`.promtext`: parsing ``/metrics`` and histogram quantiles;
- :mod:`.observe`: each poll of the sidecar and Prometheus, as a snapshot;
- :mod:`.judge`: whether each fault was detected, and the alerts it must fire;
- :mod:`.report`: value formats and the end-of-run summary;
- :mod:`.view`: the live terminal view (rich) and the ``--no-ui`` progress line;
- :mod:`.scenario`: the timeline that ties them together.
- :mod:`.vllm_engine`, :mod:`.llm_loadgen`, :mod:`.vllm_scenario`, :mod:`.vllm_view`: ``--engine vllm``'s
  server process, streamed-completion load, scenario and live view.
"""
