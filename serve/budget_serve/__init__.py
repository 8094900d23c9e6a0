"""Serving BudgetFormer's ONNX exports (budget-export-onnx) without torch or fairseq:
this package imports only the standard library, ``numpy``, ``onnxruntime`` and
``tokenizers``, and installs on its own (``pip install ./serve``: the budget-serve
distribution), so that a host serves a classifier with none of the training stack.

    from budget_serve import Predictor
    Predictor("exported/").predict(["a gripping film"])
"""

from .predictor import Prediction, Predictor

__all__ = ["Prediction", "Predictor"]
