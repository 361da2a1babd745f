"""Fuzzing harnesses for the C entry points and the reading tools (not part of the package)."""
