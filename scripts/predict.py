#!/usr/bin/env python3
"""The ``budget-predict`` command, for a checkout without ``pip install`` (budget_serve/predict.py;
with --onnx it imports neither torch nor fairseq)."""

import sys

from budget_serve.predict import main

if __name__ == "__main__":
    sys.exit(main())
