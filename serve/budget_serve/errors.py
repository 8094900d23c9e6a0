"""The commands' errors, each reported as one line without a traceback."""

import logging
import sys
from typing import Callable, Tuple


class DataError(Exception):
    """A problem with the user's input (exit status 2)."""


def run_cli(body: Callable[[], None], failures: Tuple[type, ...] = ()) -> int:
    """Run a script's body; a DataError exits 2, one of ``failures`` or an OSError (a file
    the system refuses to read or write: its message names it) 1, Ctrl-C 130, each with
    a one-line message. Warnings (fairseq's, torch's) go to stderr; INFO lines do not."""
    logging.basicConfig(level=logging.WARNING)
    try:
        body()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (*failures, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; no partial output was kept", file=sys.stderr)
        return 130
    return 0
