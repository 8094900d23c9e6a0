#!/usr/bin/env python3
"""The whole recipe's resident memory, summed over its processes, against the dense step's
alone (budget_research/benchmark/recipe_memory.py says how it is sampled):

    python examples/budgetformer/recipe_memory.py --out-dir results/width

Writes recipe-memory.{md,json}. Needs the MiniLM model and MR's TSV files (get_data.py,
or the demo, puts them under data/minilm)."""

import argparse
import logging
import sys
import tempfile
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_research.benchmark.memory import add_inputs, check_inputs  # noqa: E402
from budget_research.benchmark.recipe_memory import measure, report  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_inputs(parser, REPO)
    parser.add_argument("--shared", action="store_true",
                        help="other work ran on the machine meanwhile: recorded, and the wall time marked as not "
                             "the recipe's (the memory, the process tree's own, is unaffected)")
    args = parser.parse_args(argv)

    def body():
        check_inputs(args)
        with tempfile.TemporaryDirectory() as work:
            found = measure(args.model_dir, args.mr_train, Path(work), threads=args.threads)
        if args.shared:
            found["shared"] = True
        write_json(args.out_dir / "recipe-memory.json", found)
        text = report(found)
        write_atomic(args.out_dir / "recipe-memory.md", text)
        print(text)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
