"""Files: every file operation (`storage`), every name of a bundle's files (`layout`), local pattern matching.

Imports nothing of RecordForge but `errors`: every other package reaches disks and object stores here.
"""
