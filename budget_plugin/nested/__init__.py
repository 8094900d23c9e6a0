"""The nested model's workflow, in the order ``budget-finetune`` runs it:

- ``finetune``: the dense fine-tuning (fairseq's ``roberta``) of a converted encoder
- ``importance``: Michel et al.'s importance of its heads and FFN neurons
- ``reorder``: its heads and neurons permuted into importance order (the same function)
- ``recipe``: the five steps in one command, each done once (``step_record``: resuming)
- ``export``: a dial setting cut into a smaller stock checkpoint

The dial's calibration and allocation, the recipe's last step, are budget_plugin/dial/'s.
"""
