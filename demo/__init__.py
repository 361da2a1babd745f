"""The demo (`make demo`), its sample data and the README's picture: outside the runtime package."""
