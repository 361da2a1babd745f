"""A local worker started as a fresh interpreter (where the driver cannot fork): Beam's worker,
as quiet as a forked one. `python -m recordforge.runners.fresh_worker [--debug]`."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str]) -> None:
    debug = "--debug" in argv
    if not debug:
        # Before TensorFlow is imported (a TFT stage's worker imports it): its start-up lines.
        from recordforge.runners.quiet import silence_tensorflow_import

        silence_tensorflow_import()
    from recordforge.runners.worker_logs import quiet_worker

    quiet_worker(debug=debug)
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main([])


if __name__ == "__main__":
    main(sys.argv[1:])
