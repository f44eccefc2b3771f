"""One module per `make bench-*` (and `slogate demo`'s run): each measures, then writes its results file."""
