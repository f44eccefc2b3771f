"""The per-pod admission gate and proxy in front of llama-server."""
