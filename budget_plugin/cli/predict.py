"""Predict with a trained BudgetFormer: one example a line (tab-separated pairs), from a
file or standard input, to TSV: label, probability, and the heads run per layer.

    budget-predict --checkpoint-dir checkpoints/mr --data data/MR-bin < texts.txt
    budget-predict --checkpoint-dir checkpoints/mr --data data/MR-bin --input texts.txt --output preds.tsv
    budget-predict --onnx exported/ --input texts.txt        (an ONNX export: budget-serve-predict)

Output columns: line, label, probability (a regression model: score), with --all-scores
every label's probability, heads per layer (e.g. ``3,2,5,4``), and the selected heads of
every layer (``0.3.5|1.2|...``). Inputs are cut as the training data was.

The input must be UTF-8: a line that is not is refused, naming the file and line, as
is a line without text; nothing is predicted until every line reads.
"""

import argparse
import sys
from typing import Iterator, List, Optional, Sequence

import torch
from fairseq.data import data_utils

from budget_plugin.data.prepare import prepared_record
from budget_plugin.models.hub_interface import head_choice_of
from budget_plugin.tools.evaluation import label_names
from budget_plugin.tools.hub import add_checkpoint_arguments, load_hub
from budget_serve.predict import main as onnx_main
from budget_serve.texts import (
    add_io_arguments,
    check_io_arguments,
    fitted,
    header,
    heads_columns,
    input_texts,
    predict_command,
    prediction_columns,
)


def parse_args(argv: Optional[Sequence[str]] = None) -> Optional[argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="budget-predict", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arguments(parser)
    add_io_arguments(parser)
    parser.add_argument("--head", default="sentence_classification_head")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even when a GPU is present")
    parser.add_argument("--onnx", metavar="DIR", help="predict with budget-export-onnx's folder instead, as "
                        "budget-serve-predict does (budget-predict --onnx DIR --help: its options)")
    if asks_for_onnx(sys.argv[1:] if argv is None else argv):
        return None  # the ONNX path's, parsed there
    args = parser.parse_args(argv)
    check_io_arguments(parser, args)
    return args


def progress(batches: Sequence, args: argparse.Namespace) -> Iterator:
    """The batches, with a progress bar on stderr when reading a file."""
    if not args.input:
        return iter(batches)
    from tqdm import tqdm

    return iter(tqdm(batches, desc="predict", unit="batch", file=sys.stderr))


def asks_for_onnx(argv: Sequence[str]) -> bool:
    """Whether a command line names an ONNX export (--onnx DIR)."""
    return any(arg == "--onnx" or arg.startswith("--onnx=") for arg in argv)


def encode(hub, texts: Sequence[str], pieces_per_input: Optional[int]) -> List[int]:
    """The hub's ``encode``, each input cut to its first pieces as the data's were."""
    pieces = [" ".join(hub.bpe.encode(text).split()[:pieces_per_input]) for text in texts]
    line = "<s> " + " </s> </s> ".join(pieces) + " </s>"
    return hub.task.source_dictionary.encode_line(line, append_eos=False, add_if_not_exist=False).tolist()


def heads_run(model, extra: dict, batch: int) -> List[str]:
    """Each of the batch's examples' heads per layer and the heads it ran, as two TSV
    columns (a RoBERTa, without budget statistics: every head)."""
    if "budget" not in extra:
        layers, heads = model.args.encoder_layers, model.args.encoder_attention_heads
        return [heads_columns([heads] * layers, [range(heads)] * layers)] * batch
    choice = head_choice_of(extra)
    return [heads_columns(heads.tolist(), [layer.nonzero().flatten().tolist() for layer in selected])
            for heads, selected in zip(choice.heads, choice.selected)]


def predict_rows(args: argparse.Namespace, name: str, examples: List[List[str]]) -> List[str]:
    hub = load_hub(args)
    if torch.cuda.is_available() and not args.cpu:
        hub.cuda()
    regression = bool(hub.task.cfg.regression_target)
    names = [] if regression else label_names(hub.task, hub.model.classification_heads[args.head].out_proj.out_features)
    inputs, cut = 2 if (args.data / "input1").is_dir() else 1, prepared_record(args.data).get("truncate_tokens")
    encoded = [torch.as_tensor(fitted(encode(hub, input_texts(fields, inputs, f"{name}:{number}"), cut),
                                      hub.model.max_positions(), args.too_long, name, number))
               for number, fields in enumerate(examples, 1)]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))  # batches of like lengths
    rows = [""] * len(encoded)
    for start in progress(range(0, len(order), args.batch_size), args):
        chosen = order[start:start + args.batch_size]
        batch = data_utils.collate_tokens([encoded[i] for i in chosen], pad_idx=hub.task.source_dictionary.pad())
        with torch.no_grad():  # one forward: the prediction and the heads it ran
            features, extra = hub.model(batch.to(hub.device), features_only=True)
            logits = hub.model.classification_heads[args.head](features).float()
        outputs = (logits if regression else logits.softmax(dim=-1)).tolist()
        for i, output, heads in zip(chosen, outputs, heads_run(hub.model, extra, len(chosen))):
            rows[i] = f"{i + 1}\t{prediction_columns(output, names, regression, args.all_scores)}\t{heads}"
    return [header(regression, names if args.all_scores else ())] + rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args is None:  # --onnx: the torch-free command's options and path
        return onnx_main(argv)
    return predict_command(args, predict_rows)


if __name__ == "__main__":
    sys.exit(main())
