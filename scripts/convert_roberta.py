#!/usr/bin/env python3
"""The ``budget-convert-roberta`` command, for a checkout without ``pip install``
(budget_plugin/cli/convert_roberta.py)."""

import sys

from budget_plugin.cli.convert_roberta import main

if __name__ == "__main__":
    sys.exit(main())
