"""Runners: everything runner-specific (local forked workers, Dask, Dataflow checks and dry runs), the
traits transforms are told, and how the process imports Beam.

May import `output`, `progress`, `files`, `errors`; never `pipelines` or `transforms`.
"""
