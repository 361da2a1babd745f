"""Flex Template entry point: the launcher runs this file with the template's parameters."""

import sys

from recordforge.pipelines.convert import run

if __name__ == "__main__":
    run(sys.argv[1:])
