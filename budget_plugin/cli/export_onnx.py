"""Export a fine-tuned model at one dial setting to ONNX Runtime, with int8 if asked,
for the torch-free predictor (budget-predict --onnx OUT_DIR).

The model is cut physically first (each layer keeps the heads and FFN neurons the
setting runs), then exported; the folder gets the tokenizer, the labels and a manifest
(the setting, heads and neurons per layer, FLOPs, the checkpoint's hash, and each
file's dev accuracy next to fairseq's). budget_plugin/serving/onnx_export.py says how.

    budget-export-onnx checkpoints/mr/nested/checkpoint_best.pt exported/ --data data/MR-bin --width 0.5 --int8
    budget-export-onnx checkpoints/mr/dense/checkpoint_best.pt dense-onnx/ --data data/MR-bin
"""

import argparse
import sys
from pathlib import Path

from budget_plugin.serving.onnx_export import ExportError, export_onnx, summary
from budget_plugin.tools.errors import run_cli


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a fine-tuned checkpoint (nested, to dial it)")
    parser.add_argument("out_dir", type=Path, help="the folder to write (replaced only once complete)")
    parser.add_argument("--data", type=Path, required=True,
                        help="the binarized data folder it was trained on: its tokenizer, labels and dev split")
    setting = parser.add_mutually_exclusive_group()
    setting.add_argument("--width", help="heads and FFN neurons: a ratio R, or one heads:neurons pair per layer "
                         "(4:461,4:461,...), as budget-export's")
    setting.add_argument("--head-ratio", help="heads alone: a ratio R (what the calibrated dial runs there) or one "
                         "count per layer, as budget-export's")
    parser.add_argument("--int8", action="store_true", help="also write ONNX Runtime's dynamically quantized copy "
                        "(activations quantized per batch: an example's int8 probabilities can move slightly with "
                        "the examples batched beside it)")
    parser.add_argument("--split", default="valid", choices=["valid", "test"],
                        help="the split the export is checked and scored on (default: %(default)s)")
    args = parser.parse_args(argv)

    def body():
        manifest = export_onnx(args.checkpoint, args.data, args.out_dir, args.head_ratio, args.width, args.int8,
                               args.split)
        print(f"wrote {args.out_dir}: " + ", ".join(manifest["files"].values()) + "\n" + summary(manifest))

    return run_cli(body, failures=(ExportError,))


if __name__ == "__main__":
    sys.exit(main())
