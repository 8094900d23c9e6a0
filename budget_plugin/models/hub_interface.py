"""Load a trained BudgetFormer in three lines, tokenize as its data was, and ask which
heads it runs."""

import logging
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from fairseq.models.roberta.hub_interface import RobertaHubInterface

from ..encoders.wordpiece import TOKENIZER_FILES

logger = logging.getLogger(__name__)

SENTENCEPIECE_FILE = "sentencepiece.bpe.model"  # as budget-prepare writes it


def tokenizer_options(folders: List[Path], bpe: Optional[str], options: dict) -> dict:
    """The BPE options for ``from_pretrained``: what the caller said, else the tokenizer
    found in ``folders`` (the data folder, then the checkpoint's): a sentencepiece model
    or a WordPiece vocabulary. None found: nothing, so the checkpoint's own ``--bpe``
    (or none) applies."""
    found = {
        "sentencepiece": [f / SENTENCEPIECE_FILE for f in folders if (f / SENTENCEPIECE_FILE).is_file()],
        "wordpiece": [f / name for f in folders for name in TOKENIZER_FILES if (f / name).is_file()],
    }
    path_option = {"sentencepiece": "sentencepiece_model", "wordpiece": "wordpiece_vocab"}
    if bpe is None:
        kinds = [kind for kind, option in path_option.items() if found[kind] or option in options]
        if len(kinds) > 1:
            raise ValueError(
                f"found both a sentencepiece model and a WordPiece vocabulary in {', '.join(map(str, folders))}: "
                "pass bpe='sentencepiece' or bpe='wordpiece' (and sentencepiece_model=... or wordpiece_vocab=...)"
            )
        if not kinds:
            return {}
        bpe = kinds[0]
    if bpe not in path_option:
        return {"bpe": bpe}
    option = path_option[bpe]
    if option not in options:
        if not found[bpe]:
            raise ValueError(f"bpe='{bpe}' needs {option}=PATH: none found in {', '.join(map(str, folders))}")
        options = {option: str(found[bpe][0])}
    return {"bpe": bpe, option: options[option]}


class HeadChoice(NamedTuple):
    """What each input of a batch ran, layer by layer."""

    selected: torch.Tensor  # B x L x H bool: the heads run
    heads: torch.Tensor  # B x L: how many
    budget: torch.Tensor  # B x L: the budget the router set


@torch.no_grad()
def head_choice(model, tokens: torch.LongTensor, dial=None) -> HeadChoice:
    """The heads a BudgetFormer runs for each input of a padded batch (B x T), in layer
    order (``dial``: the budget dial's setting for this call; None: the model's own): the
    one place that reads them out of the model's per-layer statistics."""
    device = next(model.parameters()).device
    _, extra = model(tokens.to(device), features_only=True, dial=dial)
    return head_choice_of(extra)


def head_choice_of(extra: dict) -> HeadChoice:
    """The heads each input ran, from a forward's ``extra`` (its per-layer statistics)."""
    return HeadChoice(*(torch.stack([layer[key] for layer in extra["budget"]], dim=1)
                        for key in ("selected", "heads", "budget")))


class BudgetFormerHubInterface(RobertaHubInterface):
    """fairseq's RoBERTa hub interface (``encode``, ``predict``, ``extract_features``,
    ``decode``) plus :meth:`head_usage`. ``predict`` runs without autograd, so that it
    takes the fast path (with autograd recording, a layer computes every head, for the
    gradients); wrap ``extract_features`` in ``torch.no_grad()`` for the same.

    ``head_ratio=`` sets the budget dial for one call (a mean head ratio of a calibrated
    checkpoint, or one count per layer, as --head-ratio; None: the model's own), and
    ``width=`` the width dial (heads and FFN neurons, as --width). Either is handed to
    the model's forward, not set on the model, so that threads sharing one hub each run
    their own."""

    def dial(self, head_ratio: Optional[str], width: Optional[str] = None):
        """The model's dial setting for ``head_ratio`` or ``width`` (neither: the model's own)."""
        if width is not None:
            if head_ratio is not None:
                raise ValueError("give head_ratio or width, not both (a width sets the heads too)")
            return self.model.width_dial(width)
        return None if head_ratio is None else self.model.dial_of(head_ratio)

    def extract_features(self, tokens: torch.LongTensor, return_all_hiddens: bool = False,
                         head_ratio: Optional[str] = None, width: Optional[str] = None) -> torch.Tensor:
        """RoBERTa's ``extract_features``, at budget dial ``head_ratio`` or width ``width``."""
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.size(-1) > self.model.max_positions():
            raise ValueError(f"tokens exceeds maximum length: {tokens.size(-1)} > {self.model.max_positions()}")
        features, extra = self.model(tokens.to(device=self.device), features_only=True,
                                     return_all_hiddens=return_all_hiddens, dial=self.dial(head_ratio, width))
        if return_all_hiddens:
            return [inner_state.transpose(0, 1) for inner_state in extra["inner_states"]]  # T x B x C -> B x T x C
        return features

    @torch.no_grad()
    def predict(self, head: str, tokens: torch.LongTensor, return_logits: bool = False,
                head_ratio: Optional[str] = None, width: Optional[str] = None):
        """RoBERTa's ``predict``, at budget dial ``head_ratio`` or width ``width``."""
        features = self.extract_features(tokens, head_ratio=head_ratio, width=width)
        logits = self.model.classification_heads[head](features)
        return logits if return_logits else F.log_softmax(logits, dim=-1)

    @torch.no_grad()
    def head_usage(self, tokens: torch.LongTensor,
                   head_ratio: Optional[str] = None) -> Union[List[Dict], List[List[Dict]]]:
        """Per layer, the heads the model runs for this input and its budget (at the
        budget dial ``head_ratio``, if given).

        ``tokens`` is one encoded input (1-D, as from :meth:`encode`) or a padded batch
        (2-D). Returns, for one input, a list over layers of
        ``{"heads": [selected head indices], "num_heads": k, "budget": b}``;
        for a batch, one such list per example."""
        single = tokens.dim() == 1
        choice = head_choice(self.model, tokens.unsqueeze(0) if single else tokens, self.dial(head_ratio))
        usage = [
            [
                {"heads": selected.nonzero().flatten().tolist(), "num_heads": int(heads), "budget": float(budget)}
                for selected, heads, budget in zip(*example)
            ]
            for example in zip(choice.selected, choice.heads, choice.budget)
        ]
        return usage[0] if single else usage
