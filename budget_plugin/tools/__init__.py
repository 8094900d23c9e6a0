"""Helpers the commands share (not imported by the plugin itself): one idea a module.

- ``files``: atomic writes (text, bytes, JSON, whatever a library saves) and folders
- ``errors``: the commands' error types and their exit codes
- ``progress``: the long-running commands' progress lines
- ``fairseq_cli``: running fairseq's console scripts, reading their metric lines
- ``building``: models built from a registered architecture name, sizes from the registry
- ``checkpoints``: fairseq checkpoints read for measurement and conversion
- ``evaluation``: a checkpoint scored over a split: accuracy, heads run, FLOPs
- ``hub``: a trained BudgetFormer named on the command line (budget-predict)
- ``teacher``: a teacher's class logits for distillation (budget-teacher-logits)
- ``tiny_bert``: a tiny random BERT folder, for tests and the quick demo
"""
