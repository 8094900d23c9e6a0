"""Sentence(-pair) classification and regression that scores every evaluation example."""

from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask


@register_task("budget_sentence_prediction", dataclass=SentencePredictionConfig)
class BudgetSentencePredictionTask(SentencePredictionTask):
    """fairseq's ``sentence_prediction`` (same options and data layout: ``input0/``,
    optional ``input1/``, ``label/``), except that validation and test sets are scored
    in full. (BudgetFormer's options, its exploration schedule included, are model
    options; any model trains with this task.)"""

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None,
                           max_positions=None, ignore_invalid_inputs=False,
                           required_batch_size_multiple=1, **kwargs):
        # fairseq drops the last batch when its size is not a multiple of
        # --required-batch-size-multiple: harmless for a shuffled training set, but an
        # evaluation must score every example, so the multiple applies to train alone.
        if dataset is not self.datasets.get("train"):
            required_batch_size_multiple = 1
        return super().get_batch_iterator(
            dataset, max_tokens, max_sentences, max_positions, ignore_invalid_inputs,
            required_batch_size_multiple, **kwargs,
        )
