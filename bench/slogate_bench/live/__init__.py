"""The harness that drives real processes: the load generator, the fronts as processes (the sidecar,
the baselines), nginx, a stub upstream, probes and the processes' plumbing."""
