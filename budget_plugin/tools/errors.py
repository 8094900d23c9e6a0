"""The commands' errors (budget_serve/errors.py: torch-free, so that the ONNX predictor,
which runs without torch or fairseq, reports its errors as every command does)."""

from budget_serve.errors import DataError, DownloadError, PreprocessError, run_cli

__all__ = ["DataError", "DownloadError", "PreprocessError", "run_cli"]
