"""Convert a fairseq RoBERTa checkpoint (e.g. roberta.base/model.pt) into a BudgetFormer
checkpoint of the same size.

Every shared weight is taken over unchanged (the budgeted layers keep fairseq's
q_proj/k_proj/v_proj/out_proj, so heads are the same row blocks); the new head routers
start at full budget, so the converted model computes what RoBERTa computes until it is
trained. Use the result with ``fairseq-train --restore-file OUT --reset-optimizer
--reset-dataloader --reset-meters --arch budgetformer ...`` (or give the RoBERTa
checkpoint to ``--restore-file`` directly: the model upgrades it the same way).

    budget-convert-roberta roberta.base/model.pt budgetformer.base.pt
"""

import argparse
import sys
from pathlib import Path

# before fairseq (imported with the plugin) sets up logging at INFO: errors are one line
import torch

from budget_plugin.tools.checkpoints import as_budgetformer, read
from budget_plugin.tools.errors import run_cli
from budget_plugin.tools.files import atomic_path


def convert(state: dict) -> dict:
    """The checkpoint with a BudgetFormer's options and weights (routers new, at full budget)."""
    model = as_budgetformer(state)
    weights, converted = state["model"], model.state_dict()
    new = sorted(k for k in set(converted) - set(weights) if ".router." in k)  # (and the dial's empty calibration)
    dropped = sorted(set(weights) - set(converted))
    print(f"kept {len(weights) - len(dropped)} RoBERTa tensors unchanged; new (router, full budget): "
          f"{len(new)} ({', '.join(new[:2])}, ...); dropped: {dropped or 'none'}")
    out = dict(state, model=converted)
    if isinstance(state.get("cfg"), dict) and state["cfg"].get("model") is not None:
        out["cfg"] = dict(state["cfg"], model=model.args)
    else:
        out["args"] = model.args
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", type=Path, help="RoBERTa checkpoint (fairseq format)")
    parser.add_argument("output", type=Path, help="BudgetFormer checkpoint to write")
    args = parser.parse_args(argv)

    def body():
        converted = convert(read(args.input))
        with atomic_path(args.output) as tmp:  # never a half-written checkpoint
            torch.save(converted, tmp)
        print(f"wrote {args.output}")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
