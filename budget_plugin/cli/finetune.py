"""Make a budgeted model from a converted encoder and one's own data: one model that
serves every head budget, dialled at serving time.

Runs, through fairseq-train: the dense fine-tuning (fairseq's ``roberta``), the heads'
importance, their reordering (so that a budget is a prefix of the most important
heads), the nested fine-tuning (every budget at once), and the calibration of the
budget dial on dev; then scores the nested model on dev at several ``--head-ratio`` and
``--width`` (in this process, as fairseq-validate scores them) and, with the export extra
installed, exports dense and each width to ONNX Runtime int8 (SAVE_DIR/onnx/), times them
on dev at batch 1 and 32 and marks the fastest width within a point of dense on dev
(serving/width_latency.py). Prints each fairseq command and
fairseq's progress; a step that finished is not run again, so the same command
resumes where it stopped, and a command whose options differ from a finished step's is
refused unless ``--redo`` is given (budget_plugin/nested/recipe.py). Trains on the GPU
when there is one (``--cpu`` to force the CPU, ``--fp16`` for half precision). Leaves
SAVE_DIR/dense/checkpoint_best.pt and SAVE_DIR/nested/checkpoint_best.pt.

    budget-convert BERT_FOLDER models/mine
    budget-prepare --glue-dir RAW --out-dir data/mine --wordpiece models/mine --labelled-test
    budget-finetune models/mine data/mine/SST-2-bin checkpoints/mine
    fairseq-validate data/mine/SST-2-bin --user-dir $(budget-user-dir) --task budget_sentence_prediction \\
        --criterion budget_sentence_prediction --path checkpoints/mine/nested/checkpoint_best.pt --head-ratio 0.3
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

from budget_plugin.data.binarize import num_classes
from budget_plugin.dial.width import WIDTHS
from budget_plugin.nested import finetune
from budget_plugin.nested.recipe import NestedRecipe, finetune_nested
from budget_plugin.precision import CHOICES, cpu_bf16
from budget_plugin.serving.width_latency import DENSE, serving_summary
from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.errors import DataError, run_cli
from budget_plugin.tools.evaluation import accuracy_and_ratio, scored, split_batches
from budget_plugin.tools.fairseq_cli import CommandFailed
from budget_plugin.tools.progress import log

DIAL = ("1", "0.75", "0.5", "0.3", "0.2")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="a converted encoder (model.pt: budget-convert)")
    parser.add_argument("data_dir", type=Path, help="a binarized classification data set (input0/, label/)")
    parser.add_argument("save_dir", type=Path, help="where dense/, nested/ and the steps' files go")
    parser.add_argument("--num-classes", type=int, help="checked against the data's labels (default: theirs)")
    parser.add_argument("--seed", type=int, default=1)
    dense, nested = finetune.Recipe(), NestedRecipe()
    parser.add_argument("--lr", type=float, default=dense.lr, help="both fine-tunings' (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=dense.epochs, help="of the dense step (default: %(default)s)")
    parser.add_argument("--min-updates", type=int, default=dense.min_updates,
                        help="each step's updates at least, however small the data: its epochs grow to hold them "
                        "(0: the epochs alone; default: %(default)s)")
    parser.add_argument("--max-updates", type=int, help="cap on each step's updates (the study's: 240 for MR)")
    parser.add_argument("--max-tokens", type=int, default=dense.max_tokens,
                        help="a batch's pieces, padding included, at most: a batch with a long text holds fewer "
                        "examples, so that memory stays bounded; 0: --batch-size alone (default: %(default)s)")
    parser.add_argument("--validate-interval-updates", type=int, default=0,
                        help="also score dev every N updates within an epoch (default: at its end)")
    parser.add_argument("--min-heads", type=int, default=nested.min_heads,
                        help="the smallest width, heads per layer (default: %(default)s)")
    parser.add_argument("--sandwich-widths", type=int, default=nested.sandwich_widths,
                        help="fixed widths trained per update (default: %(default)s)")
    parser.add_argument("--sandwich-max-ratio", type=float, default=nested.sandwich_max_ratio,
                        help="the random widths' largest share of each layer's heads and neurons "
                        "(default: %(default)s)")
    parser.add_argument("--min-ffn-ratio", type=float, default=nested.min_ffn_ratio,
                        help="the smallest FFN width trained, a fraction of each layer's neurons; 0: the heads "
                        "alone are nested (default: %(default)s)")
    parser.add_argument("--no-router", action="store_true",
                        help="train the fixed widths only, not the router's per-input budgets: a cheaper nested "
                        "step for a model served at --width, with no --head-ratio dial (default: both)")
    parser.add_argument("--router-interval", type=int, default=nested.router_interval,
                        help="train the router's budgets every N updates, the fixed widths alone between: a "
                        "cheaper nested step that keeps the --head-ratio dial (default: %(default)s)")
    parser.add_argument("--calibration-examples", type=int, default=nested.calibration_examples,
                        help="the head dial is calibrated on about this many dev examples, spread over their "
                        "lengths (0: all of dev; default: %(default)s)")
    parser.add_argument("--threads", type=int, help="fairseq-train's CPU threads (default: torch's)")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even where there is a GPU "
                        "(default: the GPU when there is one)")
    parser.add_argument("--fp16", action="store_true", help="train in half precision (fairseq's --fp16; GPU only)")
    parser.add_argument("--cpu-precision", choices=CHOICES,
                        help="both steps' training on the CPU: bfloat16 autocast (bf16: fp32 weights, optimizer "
                        f"state and losses), fp32, or bf16 where the CPU has bfloat16 instructions (auto) (default: "
                        f"the dense step {dense.cpu_precision}, the nested step {nested.cpu_precision})")
    parser.add_argument("--no-latency", action="store_true",
                        help="skip the summary's ONNX Runtime int8 exports and timings of each width (default: "
                        "run them when onnxruntime is installed: the export extra)")
    parser.add_argument("--redo", action="store_true",
                        help="where SAVE_DIR holds steps run with other options, run them again (default: refuse)")
    args = parser.parse_args(argv)
    if args.min_updates < 0:
        parser.error(f"--min-updates must be >= 0 (0: the epochs alone), got {args.min_updates}")
    if args.router_interval < 1:
        parser.error(f"--router-interval must be >= 1, got {args.router_interval}")
    if args.calibration_examples < 0:
        parser.error(f"--calibration-examples must be >= 0 (0: all of dev), got {args.calibration_examples}")
    cpu = args.cpu or not torch.cuda.is_available()
    if args.fp16 and cpu:
        parser.error("--fp16 needs a GPU: " + ("--cpu was given" if args.cpu else "torch finds none"))

    def body():
        if not (args.model_dir / "model.pt").is_file():
            raise DataError(f"{args.model_dir}: no model.pt (convert the encoder first: budget-convert)")
        if not (args.data_dir / "label" / "dict.txt").is_file():
            raise DataError(f"{args.data_dir}: not a binarized classification data set (no label/dict.txt)")
        classes = num_classes(args.data_dir)
        if args.num_classes is not None and args.num_classes != classes:
            raise DataError(f"--num-classes {args.num_classes}, but {args.data_dir}/label/dict.txt has {classes}")
        recipe = finetune.Recipe(lr=args.lr, epochs=args.epochs, seed=args.seed, min_updates=args.min_updates,
                                 max_updates=args.max_updates,
                                 max_tokens=args.max_tokens or None,
                                 validate_interval_updates=args.validate_interval_updates, save_optimizer=False,
                                 cpu_precision=args.cpu_precision or finetune.Recipe.cpu_precision)
        budgets = NestedRecipe(lr=args.lr, max_updates=args.max_updates, min_heads=args.min_heads,
                               sandwich_widths=args.sandwich_widths, sandwich_max_ratio=args.sandwich_max_ratio,
                               min_ffn_ratio=args.min_ffn_ratio,
                               calibration_examples=args.calibration_examples, router=not args.no_router,
                               router_interval=args.router_interval,
                               cpu_precision=args.cpu_precision or NestedRecipe.cpu_precision)
        precision = " in half precision" if args.fp16 else ""
        if cpu:
            named = {True: "bfloat16 autocast", False: "fp32"}
            precision = ": " + ", ".join(f"the {step} step in {named[cpu_bf16(r.cpu_precision)]}"
                                         for step, r in (("dense", recipe), ("nested", budgets)))
        log(f"training on the {'CPU' if cpu else 'GPU'}{precision}")
        best = finetune_nested(args.model_dir, args.data_dir, args.save_dir, recipe, budgets, log, args.threads,
                               redo=args.redo, cpu=cpu, fp16=args.fp16)
        dense, task = load_checkpoint(best["dense"], args.data_dir)
        dev = split_batches(task, 64, "valid")
        dense_dev = accuracy_and_ratio(dense, dev)[0]
        log(f"dev accuracy: dense {dense_dev:.2f}")
        nested, _ = load_checkpoint(best["nested"], args.data_dir)
        heads = nested.args.encoder_attention_heads
        dialled = [r for r in DIAL if float(r) >= args.min_heads / heads] if budgets.router else []
        for ratio in dialled:  # none below the smallest width
            with nested.dialled(ratio):
                accuracy, found = accuracy_and_ratio(nested, dev)
            log(f"dev accuracy: nested --head-ratio {ratio}: {accuracy:.2f} (head ratio {found:.3f})")
        widths = {DENSE: dense_dev}
        for width in [w for w in WIDTHS if float(w) >= args.min_ffn_ratio > 0]:  # none below the smallest trained
            found = scored(nested, dev, dial=nested.width_dial(width))
            widths[f"width {width}"] = found.accuracy
            log(f"dev accuracy: nested --width {width}: {found.accuracy:.2f} (FLOPs {found.model_flops_ratio:.3f} of "
                "the full width's)")
        if len(widths) > 1 and not args.no_latency and importlib.util.find_spec("onnxruntime"):
            summary, _ = serving_summary(args.save_dir, args.data_dir, best, widths, split_batches(task, 32, "valid"),
                                      task.source_dictionary.pad(), args.threads or 2, log)
            print("\n".join(summary), flush=True)
        log("the same with fairseq-validate: fairseq-validate DATA --user-dir \"$(budget-user-dir)\" --task "
            "budget_sentence_prediction --criterion budget_sentence_prediction --path "
            f"{best['nested']} " + ("--head-ratio R (or --width R)" if budgets.router else "--width R"))

    return run_cli(body, failures=(CommandFailed,))


if __name__ == "__main__":
    sys.exit(main())
