"""Engine state read by the sidecar: vLLM, SGLang, Triton and TensorRT-LLM's backend, through their /metrics."""
