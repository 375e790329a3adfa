"""A simulated vLLM V1 server: paged KV cache, scheduler, workloads, faults and `/metrics`."""
