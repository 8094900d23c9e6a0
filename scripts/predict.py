#!/usr/bin/env python3
"""The ``budget-predict`` command, for a checkout without ``pip install``."""

import sys

from budget_plugin.cli.predict import main

if __name__ == "__main__":
    sys.exit(main())
