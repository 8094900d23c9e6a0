"""The user's commands, installed as console scripts (setup.py) and runnable from
``scripts/``: each module's ``main(argv)`` returns the exit status.

``budget-convert`` (a pretrained BERT into fairseq), ``budget-prepare`` (GLUE-style TSV
data binarized), ``budget-finetune`` (the nested recipe: dense, importance, reorder,
nested, calibration), ``budget-calibrate``, ``budget-export`` (a dial setting cut into a
smaller checkpoint), ``budget-predict``; and ``budget-importance``,
``budget-teacher-logits`` and ``budget-convert-roberta`` for the steps one at a time."""
