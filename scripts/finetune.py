#!/usr/bin/env python3
"""The ``budget-finetune`` command, for a checkout without ``pip install`` (budget_plugin/cli/finetune.py)."""

import sys

from budget_plugin.cli.finetune import main

if __name__ == "__main__":
    sys.exit(main())
