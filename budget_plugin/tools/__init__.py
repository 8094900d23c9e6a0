"""Tooling for the scripts and tests (not imported by the plugin itself): one idea a module.

- ``files``: atomic writes (text, bytes, JSON, whatever a library saves) and folders
- ``errors``: the scripts' error types and their exit codes
- ``fairseq_cli``: running fairseq's console scripts, reading their metric lines
- ``building``: models built from a registered architecture name, sizes from the registry
- ``study``: what the accuracy study (reproduce.py) and the sweep (sweep.py) share
- ``timing``: fair timings (interleaved, rotating rounds) and the machine they ran on
- ``hub``: a trained BudgetFormer named on the command line (predict.py, plot_heads.py)
- ``glue_layout``, ``tsv``, ``vocabulary``, ``binarize``, ``prepare``: GLUE-style data
  preparation (scripts/prepare_glue.py, scripts/get_data.py, scripts/demo.py)
"""
