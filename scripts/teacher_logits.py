#!/usr/bin/env python3
"""The ``budget-teacher-logits`` command, for a checkout without ``pip install``
(budget_plugin/cli/teacher_logits.py)."""

import sys

from budget_plugin.cli.teacher_logits import main

if __name__ == "__main__":
    sys.exit(main())
