"""The layout's promises: the product (budget_plugin, every module of it) never imports
the studies; the serving package (budget_serve, every module of it) imports neither
torch nor fairseq (that the studies' commands find the repository:
studies/test_study_tools.py)."""

import subprocess
import sys

from helpers import REPO

PRODUCT_NEVER_IMPORTS_RESEARCH = """
import importlib, pkgutil, sys
import budget_plugin
for module in pkgutil.walk_packages(budget_plugin.__path__, "budget_plugin."):
    importlib.import_module(module.name)
print(sorted(name for name in sys.modules if name.split(".")[0] in ("budget_research", "matplotlib")))
"""


def test_no_module_of_the_product_imports_the_studies():
    found = subprocess.run([sys.executable, "-c", PRODUCT_NEVER_IMPORTS_RESEARCH], cwd=REPO / "tests",
                           capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", found.stdout


SERVING_NEEDS_NEITHER_TORCH_NOR_FAIRSEQ = """
import importlib, pkgutil, sys
sys.modules["torch"] = sys.modules["fairseq"] = None  # import torch: ImportError
import budget_serve
for module in pkgutil.walk_packages(budget_serve.__path__, "budget_serve."):
    importlib.import_module(module.name)
print(sorted(name for name in sys.modules if name.split(".")[0] in ("budget_plugin", "torch", "fairseq")
             and sys.modules[name] is not None))
"""


def test_the_serving_package_imports_neither_torch_nor_fairseq():
    found = subprocess.run([sys.executable, "-c", SERVING_NEEDS_NEITHER_TORCH_NOR_FAIRSEQ], cwd=REPO / "tests",
                           capture_output=True, text=True)
    assert found.returncode == 0 and found.stdout.strip() == "[]", found.stdout + found.stderr
