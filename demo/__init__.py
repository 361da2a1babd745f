"""The demo (`make demo`), its sample data and the README's stats picture: used by the demo, the
tests and the benchmarks, never shipped in the recordforge package."""
