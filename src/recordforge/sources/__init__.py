"""Sources without Beam: format probing, CSV types, fixed-size lists, Parquet row groups, read-ahead.

May import `files`, `errors` and `arrays`; the Beam composites that read sources live in `transforms`.
"""
