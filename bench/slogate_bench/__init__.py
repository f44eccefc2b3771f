"""Load generation and benchmarks against the real llama-server, with and without the gate."""
