"""The long-running scripts' progress lines."""

import sys
import time
from pathlib import Path


def log(message: str) -> None:
    """A timestamped progress line, named after the running script."""
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {message}", flush=True)
