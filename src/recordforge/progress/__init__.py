"""Progress: the rows each process has converted, and the one line a terminal shows of a run or a scan.

May import `files` and `errors`.
"""
