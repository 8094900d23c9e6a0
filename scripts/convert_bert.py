#!/usr/bin/env python3
"""The ``budget-convert`` command, for a checkout without ``pip install`` (budget_plugin/cli/convert.py)."""

import sys

from budget_plugin.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
