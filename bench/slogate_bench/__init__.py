"""Benchmarks of slogate: the live harness (`live`), one module per `make bench-*` (`runs`), and the
reports they publish (`reports`). The simulator they share with `slogate simulate` is `slogate_sim`."""
