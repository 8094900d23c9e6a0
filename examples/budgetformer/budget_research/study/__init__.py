"""The accuracy study on a pretrained encoder (examples/budgetformer/reproduce.py), in four steps that
pass values, not text:

- ``plan``: the study's settings, its runs and the records that decide them (read once)
- ``train``: fine-tuning and scoring the runs a plan has ready, writing their records
- ``measure``: FLOPs, heads and latency of a data set and seed's checkpoints side by
  side, and which heads the learned runs chose (cached beside the records)
- ``report``: the summary over seeds, the targets, the tables, the paragraph, the figure
"""
