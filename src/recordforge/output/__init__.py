"""The output: its state, lock and lease, finished pieces, shard files and plans, bundle metadata, and the
publishing protocol that commits a version.

May import `records`, `schemas`, `files`, `errors`; never Beam, never `pipelines`.
"""
