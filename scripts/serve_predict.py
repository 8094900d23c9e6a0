#!/usr/bin/env python3
"""The ``budget-serve-predict`` command (torch-free), for a checkout without ``pip install``."""

import sys

from budget_serve.predict import main

if __name__ == "__main__":
    sys.exit(main())
