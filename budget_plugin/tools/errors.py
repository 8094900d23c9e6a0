"""The commands' errors: the serving package's (DataError: the user's input, exit 2; one
line, no traceback) and the training side's own failures (exit 1)."""

from typing import Callable, Tuple

from budget_serve.errors import DataError
from budget_serve.errors import run_cli as run_serving_cli


class PreprocessError(Exception):
    """fairseq-preprocess failed; carries the tail of its output (exit status 1)."""


class DownloadError(Exception):
    """pip could not fetch a package: no network, index down, ... (exit status 1)."""


def run_cli(body: Callable[[], None], failures: Tuple[type, ...] = (PreprocessError,)) -> int:
    """budget_serve's run_cli, with fairseq-preprocess's failure among the exit-1 errors."""
    return run_serving_cli(body, failures)


__all__ = ["DataError", "DownloadError", "PreprocessError", "run_cli"]
