"""Tooling for the scripts and tests (not imported by the plugin itself): one idea a module.

- ``files``: atomic writes (text, bytes, JSON, whatever a library saves) and folders
- ``errors``: the scripts' error types and their exit codes
- ``fairseq_cli``: running fairseq's console scripts, reading their metric lines
- ``building``: models built from a registered architecture name, sizes from the registry
- ``study``: the accuracy study's run records (reproduce.py)
- ``finetune``: the fine-tuning recipe of a converted pretrained encoder (demo.py, reproduce.py)
- ``importance``: Michel et al.'s head importance (head_importance.py, reproduce.py)
- ``measure``: FLOPs, heads and CPU latency of checkpoints side by side (demo.py, reproduce.py)
- ``timing``: fair timings (interleaved, rotating rounds) and the machine they ran on
- ``hub``: a trained BudgetFormer named on the command line (predict.py, plot_heads.py)
- ``glue_layout``, ``tsv``, ``vocabulary``, ``binarize``, ``prepare``: GLUE-style data
  preparation (scripts/prepare_glue.py, scripts/get_data.py, scripts/demo.py)
"""
