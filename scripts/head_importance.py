#!/usr/bin/env python3
"""The ``budget-importance`` command, for a checkout without ``pip install`` (budget_plugin/cli/importance.py)."""

import sys

from budget_plugin.cli.importance import main

if __name__ == "__main__":
    sys.exit(main())
