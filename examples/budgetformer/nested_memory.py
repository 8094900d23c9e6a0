#!/usr/bin/env python3
"""Peak resident memory of the recipe's dense and nested steps on short texts with a
few long ones (budget_research/benchmark/memory.py says how it is measured).

    python examples/budgetformer/nested_memory.py --out-dir results/width

Writes memory.md (the table) and memory.json. Needs the MiniLM model and MR's TSV files
(get_data.py, or the demo, puts them under data/minilm)."""

import argparse
import logging
import sys
import tempfile
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_research.benchmark.memory import add_inputs, check_inputs, measure  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def table(rows) -> str:
    dense = {(row["max_tokens"], row["malloc"]): row for row in rows if row["step"] == "dense"}
    lines = ["| step | batching | malloc | peak resident memory (GiB) | vs the dense step, same settings | "
             "CPU time (s) |", "|---|---|---|---|---|---|"]
    for row in rows:
        batching = f"--max-tokens {row['max_tokens']}" if row["max_tokens"] else "--batch-size 32 alone"
        base = dense[row["max_tokens"], row["malloc"]]
        lines.append(f"| {row['step']} | {batching} | {row['malloc']} | {row['peak_rss_gib']:.2f} | "
                     f"{row['peak_rss_gib'] / base['peak_rss_gib']:.2f}x | {row['cpu_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_inputs(parser, REPO)
    parser.add_argument("--short", type=int, default=256, help="short texts (MR sentences)")
    parser.add_argument("--long", type=int, default=6, help="texts of --words words (cut at 512 pieces)")
    parser.add_argument("--words", type=int, default=1200)
    args = parser.parse_args(argv)

    def body():
        check_inputs(args)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        settings = {"short": args.short, "long": args.long, "words": args.words, "threads": args.threads}

        def keep(rows):  # after every step: a stopped run keeps the steps it measured
            write_json(args.out_dir / "memory.json", {"settings": settings, "rows": rows})
            write_atomic(args.out_dir / "memory.md", table(rows))

        with tempfile.TemporaryDirectory() as work:
            rows = measure(args.model_dir, args.mr_train, Path(work), args.short, args.long, args.words,
                           threads=args.threads, keep=keep)
        print(table(rows))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
