"""BudgetFormer: RoBERTa's sentence encoder with budgeted attention in every layer."""

import logging
from pathlib import Path
from typing import Iterator, Optional

import torch
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_architecture
from fairseq.modules import layer_norm as fairseq_layer_norm
from fairseq.utils import safe_getattr, safe_hasattr

from ..config import BudgetConfig
from ..dial.model import DialMixin
from ..dial.settings import Dial
from ..dial.state_format import STATE_FORMAT, upgrade_state
from ..modules import BudgetedAttention, Exploration, exploration_at
from ..option_error import require
from .budget_encoder import BudgetFormerEncoder
from .hub_interface import BudgetFormerHubInterface, tokenizer_options

logger = logging.getLogger(__name__)

DEFAULT_LAYERNORM_EPS = 1e-5  # fairseq.modules.LayerNorm's; BERT-family models use 1e-12
LAYER_NORMS = (torch.nn.LayerNorm,)  # what fairseq.modules.LayerNorm builds ...
if fairseq_layer_norm.has_fused_layernorm:  # ... or, on CUDA, apex's fused one
    LAYER_NORMS += (fairseq_layer_norm.FusedLayerNorm,)


@register_model("budgetformer")
class BudgetFormerModel(DialMixin, RobertaModel):
    """RoBERTa-style classifier whose attention layers choose, per input, how many
    heads to run and which. ``model(tokens)[1]["budget"]`` holds each layer's
    statistics. The model owns its exploration schedule (a function of the update
    number fairseq hands it). A call's ``dial`` (``Dial.heads_per_layer(k, layers)``
    fixes every layer's count) applies in training as at evaluation; the model's own
    setting (``--head-ratio``, ``--width``, :meth:`dialled`: dial/model.py's) at
    evaluation only."""

    @classmethod
    def hub_models(cls):
        return {}  # no hosted weights: load local checkpoints with from_pretrained

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path,
        checkpoint_file="checkpoint_best.pt",
        data_name_or_path=".",
        bpe=None,
        **kwargs,
    ) -> BudgetFormerHubInterface:
        """``BudgetFormerModel.from_pretrained(checkpoint_dir, "checkpoint_best.pt",
        data_dir)``. The tokenizer is the one the data was prepared with, found in the
        data folder or next to the checkpoint (``sentencepiece.bpe.model``, or a
        WordPiece ``tokenizer.json``/``vocab.txt``), else the checkpoint's own
        ``--bpe``; pass ``bpe=`` (and ``sentencepiece_model=``/``wordpiece_vocab=``) to
        choose. Loading keeps torch's ``weights_only=True``."""
        from fairseq import hub_utils

        data = Path(data_name_or_path)
        if data_name_or_path.startswith("."):
            data = Path(model_name_or_path, data_name_or_path)
        kwargs.update(tokenizer_options([data, Path(model_name_or_path)], bpe, kwargs))
        loaded = hub_utils.from_pretrained(
            model_name_or_path,
            checkpoint_file,
            data_name_or_path,
            archive_map=cls.hub_models(),
            load_checkpoint_heads=True,
            **kwargs,
        )
        model = loaded["models"][0].eval()
        return BudgetFormerHubInterface(loaded["args"], loaded["task"], model)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies init_bert_params to every nn.Linear ...
        for attention in self.budgeted_attentions():  # ... so the routers are re-initialised
            attention.router.reset_parameters()
        # fairseq fixes every LayerNorm's eps at 1e-5; a converted BERT needs its own (1e-12)
        eps = safe_getattr(args, "layernorm_eps", DEFAULT_LAYERNORM_EPS)
        for module in self.modules():  # embedding LayerNorm, each layer's two, the LM head's
            if isinstance(module, LAYER_NORMS):
                module.eps = eps
        self.budget = encoder.sentence_encoder.budget  # the config the layers were built with
        self.num_updates = 0
        # the layout of this state dict (dial/state_format.py), so that a later one is refused by name
        self.register_buffer("budget_format", torch.tensor(STATE_FORMAT))
        self.init_dial(args)

    def upgrade_state_dict_named(self, state_dict, name):
        """Warm start: a RoBERTa state dict (every key but the head routers) loads as is;
        the routers keep their fresh initialisation, which starts at full budget, so
        the warm-started model computes what RoBERTa computes. A checkpoint without a
        budget dial's calibration loads uncalibrated."""
        super().upgrade_state_dict_named(state_dict, name)  # the children rename old keys
        prefix = name + "." if name else ""
        upgrade_state(self, state_dict, prefix)  # the format checked; the dial's table as this code reads it
        router = {k: v for k, v in self.state_dict().items() if ".router." in k}
        new = [k for k in router if prefix + k not in state_dict]
        if new and len(new) == len(router):  # a checkpoint without routers: RoBERTa
            for k in new:
                state_dict[prefix + k] = router[k]
            own = {prefix + k for k in self.state_dict()}
            dropped = sorted(k for k in state_dict if k not in own)
            logger.info(
                "warm start from a checkpoint without head routers: %d new router "
                "parameters (%s, ...) start at full budget; keys not in this model: %s",
                len(new), new[0], dropped or "none",
            )

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument(
            "--layernorm-eps", type=float, metavar="EPS",
            help=f"epsilon of every LayerNorm of the model (default {DEFAULT_LAYERNORM_EPS}, fairseq's; "
            "1e-12 reproduces BERT-family models, see budget-convert)",
        )
        parser.add_argument(
            "--ffn-neurons", metavar="N,N,...",
            help="FFN neurons of each layer (comma-separated): an export's, cut to a width "
            "(budget-export); default: --encoder-ffn-embed-dim in every layer",
        )
        gen_parser_from_dataclass(parser, BudgetConfig())

    @classmethod
    def build_model(cls, args, task):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        budgetformer_architecture(args)
        heads, dim = args.encoder_attention_heads, args.encoder_embed_dim
        require(dim % heads == 0, "encoder_embed_dim", f"divisible by --encoder-attention-heads ({heads})", dim)
        require(args.layernorm_eps > 0, "layernorm_eps", "> 0", args.layernorm_eps)
        budget = BudgetConfig.fill_args(args)
        target = safe_getattr(args, "target_head_ratio", None)  # the criterion's, which fairseq-train hands on
        if budget.predicts_budget and budget.initial_budget is None and target:
            # start where the budget term will hold it (saved in the cfg: a checkpoint records its start)
            start = max(float(budget.min_heads), min(float(heads), target * heads))
            budget.initial_budget = args.initial_budget = start
        budget.check(args.encoder_layers, heads)
        if not safe_hasattr(args, "max_positions"):
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        encoder = BudgetFormerEncoder(args, task.source_dictionary)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return cls(args, encoder)

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, classification_head_name=None,
                dial: Optional[Dial] = None, **kwargs):
        """RoBERTa's forward; ``dial``: the budget dial for this call (``self.dial_of(
        "0.3")``), handed to every router as an argument; None: the model's own setting
        at evaluation, none in training (an evaluation setting never trains)."""
        if dial is None:
            dial = Dial() if self.training else self.dial_setting
        return super().forward(src_tokens, features_only, return_all_hiddens, classification_head_name,
                               dial=dial, **kwargs)

    def budgeted_attentions(self) -> Iterator[BudgetedAttention]:
        return (m for m in self.modules() if isinstance(m, BudgetedAttention))

    def set_num_updates(self, num_updates):
        """fairseq calls this on every update and after loading a checkpoint; the
        routers (submodules) receive it too and explore accordingly."""
        self.num_updates = num_updates
        super().set_num_updates(num_updates)

    def exploration(self) -> Exploration:
        """The exploration of the current update (none at evaluation)."""
        return exploration_at(self.budget, self.num_updates, self.training)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        result = super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        self.reset_dial()  # the dial reads the calibration just loaded
        return result


@register_model_architecture("budgetformer", "budgetformer")
def budgetformer_architecture(args):
    BudgetConfig.fill_args(args)
    args.layernorm_eps = safe_getattr(args, "layernorm_eps", DEFAULT_LAYERNORM_EPS)
    roberta_architecture(args)


@register_model_architecture("budgetformer", "budgetformer_base")
def budgetformer_base_architecture(args):
    budgetformer_architecture(args)


def _sized(layers: int, dim: int, ffn: int, heads: int, **defaults):
    def architecture(args):
        args.encoder_layers = safe_getattr(args, "encoder_layers", layers)
        args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", dim)
        args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", ffn)
        args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", heads)
        for name, value in defaults.items():  # e.g. layernorm_eps, max_positions
            setattr(args, name, safe_getattr(args, name, value))
        budgetformer_architecture(args)

    return architecture


for _name, _size in {
    "budgetformer_large": (24, 1024, 4096, 16),
    "budgetformer_small": (4, 256, 1024, 8),
    "budgetformer_tiny": (2, 64, 128, 4),
}.items():
    register_model_architecture("budgetformer", _name)(_sized(*_size))

# sentence-transformers' all-MiniLM-L6-v2 (a BERT) as budget-convert converts it
register_model_architecture("budgetformer", "budgetformer_minilm")(
    _sized(6, 384, 1536, 12, layernorm_eps=1e-12, max_positions=512)
)
