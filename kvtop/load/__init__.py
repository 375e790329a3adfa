"""Load for an inference server through its OpenAI-compatible API: a streamed-completion
client timed from the client's side, synthetic prompts, workloads, and the driver that
keeps rate and concurrency within bounds (used by ``kvtop rehearse``)."""
