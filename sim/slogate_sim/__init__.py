"""The simulator `slogate simulate` ships: llama-server pods, the fronts before them, balancers,
the HPA and the clairvoyant bound, on virtual time. Pure: it imports the admission core and
numpy only (an import-linter contract), and runs the core's GateMachine, the sidecar's own gate."""
