#!/usr/bin/env python3
"""The ``budget-calibrate`` command, for a checkout without ``pip install`` (budget_plugin/cli/calibrate.py)."""

import sys

from budget_plugin.cli.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
