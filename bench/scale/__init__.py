"""Scale benchmark: a fresh control plane under N simulated agents (`python -m bench.scale`, `make bench-scale`)."""
