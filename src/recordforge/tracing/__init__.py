"""Tracing: the spans of a run's stages, per process and thread, for `--profile` (a Chrome trace).

Just above `files` in the layers: every package above may record a span (`spans` imports nothing
of RecordForge); the driver merges them (`trace`, which writes through `files.storage`).
"""
