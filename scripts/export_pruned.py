#!/usr/bin/env python3
"""The ``budget-export`` command, for a checkout without ``pip install`` (budget_plugin/cli/export.py)."""

import sys

from budget_plugin.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
