"""Every published table, figure and doc block, rendered from a results file (never by hand);
`python -m slogate_bench.reports` re-renders any of them."""
