"""Files and folders that appear complete or not at all (budget_serve/files.py:
torch-free, so that the ONNX predictor writes its output as every command does)."""

from budget_serve.files import PathLike, atomic_path, building_dir, relax_permissions, write_atomic, write_json

__all__ = ["PathLike", "atomic_path", "building_dir", "relax_permissions", "write_atomic", "write_json"]
