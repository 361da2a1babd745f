"""Conforming record batches to a schema's plan: casts, ops and checks, JSON lists, split assignment.

May import `schemas`, `images`, `sources`, `files`, `errors` and `arrays`; never Beam.
"""
