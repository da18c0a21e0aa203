"""Kangaroo's exit adapter (Liu et al. 2024, arXiv 2404.18911): the target's first `exit_layer` layers, then one
attention block between two norms, then the target's own LM head, make a self-speculative draft model.

The adapter owns only the attention block and its two RMS norms (Kangaroo's 67 M parameters on Vicuna-7B; about
0.15 M on the embedded 192-wide target); the shallow layers and the head are the target's, shared and frozen
(`mmspec.adapters.views.kangaroo_view`). It is trained to give at its exit the target's final law at the same position
(`python -m mmspec.zoo.train_kangaroo`). Drafting through the view is an ordinary draft model with a cache of its own
(`mmspec.text.drafters.KangarooDrafter`), so the draft's law is recorded as it is drawn and verification is exact;
Kangaroo's double early exit stops a row's chain where the exit's top-1 confidence falls below a threshold
(`mmspec.core.drafting.stops.ConfidenceStop`).

An adapter trained at several exits at once (`exit_layers`; S2D's sorted fine-tuning, Kavehzadeh et al. 2024, arXiv
2407.01955) serves each of them: the nested drafts of the target's first 2, 4, 6 ... layers, one chosen per step
(`mmspec.text.sorted_exits.SortedExitDrafter`).
"""

from __future__ import annotations

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from mmspec.adapters.views import check_exit_layer


class NoFeedForward(nn.Module):
    """The adapter's block has attention only: its feed-forward adds nothing to the residual."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.new_zeros(())


class KangarooAdapter(ModelMixin, ConfigMixin):
    """One attention block (pre-norm, residual, rotary positions) and a final norm, read by the target's LM head.

    exit_layer: how many of the target's layers it reads the output of; hidden_size, num_attention_heads,
    num_key_value_heads, head_dim, rms_norm_eps, rope_theta, max_position_embeddings: the target's (its rotary table
    is the target's own, shared through the view); exit_layers: every exit it was trained for (sorted, S2D's sorted
    fine-tuning; None: `exit_layer` alone), `exit_layer` among them (the exit a Kangaroo drafter uses)."""

    @register_to_config
    def __init__(self, exit_layer: int = 3, hidden_size: int = 192, num_attention_heads: int = 6,
                 num_key_value_heads: int = 6, head_dim: int = 32, rms_norm_eps: float = 1e-6,
                 rope_theta: float = 10000.0, max_position_embeddings: int = 1024,
                 exit_layers: list[int] | None = None):
        super().__init__()
        if exit_layers is not None and (list(exit_layers) != sorted(set(exit_layers)) or exit_layer not in exit_layers):
            raise ValueError(f"exit_layers must be distinct, ascending and hold exit_layer ({exit_layer}), got "
                             f"{exit_layers}")
        config = LlamaConfig(hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                             num_key_value_heads=num_key_value_heads, head_dim=head_dim, intermediate_size=1,
                             num_hidden_layers=exit_layer + 1, rms_norm_eps=rms_norm_eps,
                             max_position_embeddings=max_position_embeddings,
                             rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
        self.block = LlamaDecoderLayer(config, layer_idx=exit_layer)  # its cache slot: after the shared layers
        self.block.mlp, self.block.post_attention_layernorm = NoFeedForward(), nn.Identity()
        self.norm = LlamaRMSNorm(hidden_size, eps=rms_norm_eps)

    @property
    def exits(self) -> tuple[int, ...]:
        """The exits it serves, ascending: `exit_layers`, or `exit_layer` alone."""
        return tuple(self.config.exit_layers or (self.config.exit_layer,))

    @classmethod
    def for_target(cls, target, exit_layer: int, exit_layers: list[int] | None = None) -> KangarooAdapter:
        """A new adapter for a transformers Llama-style `target` exiting after `exit_layer` layers (and, sorted, at
        each of `exit_layers`), its attention initialised from the target's layer after `exit_layer` (training then
        starts from a block that already reads those features) and its norm from the target's final norm."""
        config = target.config
        for layer in exit_layers or (exit_layer,):
            check_exit_layer(layer, config.num_hidden_layers)
        adapter = cls(exit_layer=exit_layer, hidden_size=config.hidden_size,
                      num_attention_heads=config.num_attention_heads,
                      num_key_value_heads=config.num_key_value_heads,
                      head_dim=getattr(config, "head_dim", config.hidden_size // config.num_attention_heads),
                      rms_norm_eps=config.rms_norm_eps, rope_theta=config.rope_parameters["rope_theta"],
                      max_position_embeddings=config.max_position_embeddings,
                      exit_layers=None if exit_layers is None else sorted(exit_layers))
        following = target.model.layers[exit_layer]
        adapter.block.self_attn.load_state_dict(following.self_attn.state_dict())
        adapter.block.input_layernorm.load_state_dict(following.input_layernorm.state_dict())
        adapter.norm.load_state_dict(target.model.norm.state_dict())
        return adapter.type(target.dtype)  # ModelMixin.to warns on every dtype cast (diffusers 0.42)
