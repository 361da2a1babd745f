"""The `recordforge` command line: parses, calls the library, prints one line per failure.

The top layer: may import every other package; none imports it.
"""
