"""llama-server's interface, in one place: its /metrics, its flags, its HTTP API and its stream formats."""
