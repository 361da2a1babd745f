"""The convert pipeline: flags, the resolved `Run`, `build(pipeline, run)` and `run(argv)`.

May import every package but `cli`.
"""
