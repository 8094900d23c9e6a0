"""Load a trained BudgetFormer in three lines, and ask which heads it runs."""

from typing import Dict, List, Union

import torch

from fairseq.models.roberta.hub_interface import RobertaHubInterface


class BudgetFormerHubInterface(RobertaHubInterface):
    """fairseq's RoBERTa hub interface (``encode``, ``predict``, ``extract_features``,
    ``decode``) plus :meth:`head_usage`."""

    @torch.no_grad()
    def head_usage(self, tokens: torch.LongTensor) -> Union[List[Dict], List[List[Dict]]]:
        """Per layer, the heads the model runs for this input and its budget.

        ``tokens`` is one encoded input (1-D, as from :meth:`encode`) or a padded batch
        (2-D). Returns, for one input, a list over layers of
        ``{"heads": [selected head indices], "num_heads": k, "budget": b}``;
        for a batch, one such list per example."""
        single = tokens.dim() == 1
        batch = tokens.unsqueeze(0) if single else tokens
        _, extra = self.model(batch.to(device=self.device), features_only=True)
        usage = [
            [
                {
                    "heads": layer["selected"][i].nonzero().flatten().tolist(),
                    "num_heads": int(layer["heads"][i]),
                    "budget": float(layer["budget"][i]),
                }
                for layer in extra["budget"]
            ]
            for i in range(batch.size(0))
        ]
        return usage[0] if single else usage
