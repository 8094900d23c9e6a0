#!/usr/bin/env python3
"""The ``budget-prepare`` command, for a checkout without ``pip install`` (budget_plugin/cli/prepare.py)."""

import sys

from budget_plugin.cli.prepare import main

if __name__ == "__main__":
    sys.exit(main())
