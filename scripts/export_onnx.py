#!/usr/bin/env python3
"""The ``budget-export-onnx`` command, for a checkout without ``pip install`` (budget_plugin/cli/export_onnx.py)."""

import sys

from budget_plugin.cli.export_onnx import main

if __name__ == "__main__":
    sys.exit(main())
