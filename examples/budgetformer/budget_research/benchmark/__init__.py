"""The side-by-side benchmark of stock fairseq RoBERTa and BudgetFormer
(examples/budgetformer/benchmark.py's docstring says what is measured and how):

- ``config``: its settings (BenchmarkConfig) and the fixed choices it reports
- ``models``: the pair it compares (same weights), from a registered size or a checkpoint
- ``cell``: one inference cell (size, batch, length): FLOPs, memory, latency per implementation
- ``training``: training steps in this process, and fairseq-train's updates/s
- ``tables``: the markdown tables of a report
- ``run``: every cell of a config, the report written after each
"""
