"""A trained BudgetFormer named on a script's command line, loaded as its hub interface."""

import argparse
from pathlib import Path

from budget_plugin import BudgetFormerModel
from budget_plugin.tools.errors import DataError


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--checkpoint-file", default="checkpoint_best.pt")
    parser.add_argument("--data", required=True, type=Path,
                        help="the binarized data folder (dictionaries, and the tokenizer the data was prepared with)")
    setting = parser.add_mutually_exclusive_group()
    setting.add_argument("--head-ratio",
                         help="the budget dial: a mean head ratio R (a calibrated checkpoint: budget-calibrate), "
                         "or one head count per layer (4,4,3,3,4,4); default: the router's own budgets")
    setting.add_argument("--width",
                         help="the width dial: heads and FFN neurons cut to a ratio R in every layer, or one "
                         "heads:neurons pair per layer (4:461,4:461,...)")


def load_hub(args: argparse.Namespace):
    """The checkpoint with its task, the data's dictionaries and tokenizer; a missing
    checkpoint or data folder is refused naming its option."""
    if not (args.checkpoint_dir / args.checkpoint_file).is_file():
        raise DataError(f"--checkpoint-dir {args.checkpoint_dir}: no {args.checkpoint_file} in it")
    if not (args.data / "input0" / "dict.txt").is_file():
        raise DataError(f"--data {args.data}: not a binarized data folder (no input0/dict.txt)")
    dial = {option: getattr(args, option) for option in ("head_ratio", "width") if getattr(args, option, None)}
    return BudgetFormerModel.from_pretrained(str(args.checkpoint_dir), args.checkpoint_file, str(args.data.resolve()),
                                             **dial)
