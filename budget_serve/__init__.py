"""Serving BudgetFormer's ONNX exports (budget-export-onnx) without torch or fairseq:
this package imports only the standard library, ``numpy``, ``onnxruntime`` and
``tokenizers``, so that a classifier runs where neither is installed
(docs/installation.md: installing it alone). ``budget_plugin`` shares its torch-free
helpers (errors, atomic files, the predictor's input and output)."""
