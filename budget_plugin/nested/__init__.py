"""The nested model's workflow, in the order ``budget-finetune`` runs it:

- ``finetune``: the dense fine-tuning (fairseq's ``roberta``) of a converted encoder
- ``importance``: Michel et al.'s head importance of the dense model
- ``reorder``: its heads permuted into importance order (the same function)
- ``recipe``: the five steps in one command, each done once
- ``calibration``: the budget dial (``--head-ratio``) calibrated on a split
- ``export``: a dial setting cut into a smaller stock checkpoint
"""
