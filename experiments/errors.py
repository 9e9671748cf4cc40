"""The one exception type that the entry point reports as a single line (no traceback), and
the entry point of the programs that report it so."""

import sys

from absl import app


class UserError(Exception):
    """A problem the user can fix (configuration, devices, data, divergence), with a message
    that says what went wrong and what to do."""


def run_program(define_flags, run):
    """A program's entry point: ``define_flags()``, then ``run()`` under absl, a
    :class:`UserError` reported as one ``error: ...`` line on stderr with exit status 1."""
    define_flags()

    def main(argv):
        del argv
        try:
            run()
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(1)

    app.run(main)
