"""Views of a transformers causal LM that share its weights: a shallow copy with module and hook dicts of its own
(`module_view`), its first layers with its head (`early_exit_view`, LayerSkip's draft), the same with a Kangaroo exit
adapter on top (`kangaroo_view`), a head that scores a trimmed vocabulary (`trimmed_view`, VocabTrim), a decoder layer
that keeps its cache in another slot (`block_at`), and a family's own readout of its image tokens as a module
(`Readout`, what an image adapter's "features" capability hands a draft head). The text drafters run them; the models
that train for them (`mmspec.models.kangaroo`) check against them.
"""

from __future__ import annotations

import copy

import torch


def module_view(model: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy of `model` sharing its weights, with module and hook dicts of its own: copy.copy shares them
    with the original, and a view must be able to swap a submodule, and must not fire the original's hooks (such as
    forward counters on the target) for draft calls."""
    view = copy.copy(model)
    for name, value in vars(model).items():
        if name == "_modules" or name.endswith("hooks") or "_hooks_" in name:
            setattr(view, name, type(value)(value) if name == "_modules" else type(value)())
    return view


class Readout(torch.nn.Module):
    """A function of a model's own modules as a module: `forward(x) = read(x)`, such as an image family's embedding of
    its image tokens or its logits of them from features (a draft head reads through both, and a feature tap's
    pre-hook catches this module's input). `reads`: the module whose dtype and device are this module's (the model
    whose hidden states `read` takes)."""

    def __init__(self, read, reads: torch.nn.Module):
        super().__init__()
        self.read, self.reads = read, reads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.read(x)


def trimmed_view(model, vocabulary: torch.Tensor):
    """`model` (a transformers causal LM) whose LM head scores only the tokens `vocabulary` ([|S|] long ids, distinct,
    sorted): logits [..., |S|] in that order, from its head's rows gathered once. The rest is shared."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"a draft vocabulary trims a transformers draft model's head, got {type(model).__name__}")
    view = module_view(model)
    view.set_output_embeddings(trimmed_readout(model.get_output_embeddings(), vocabulary))
    return view


def trimmed_readout(head: torch.nn.Linear, vocabulary: torch.Tensor) -> torch.nn.Linear:
    """A new LM head of the rows of `head` ([V, d]) at the ids `vocabulary` ([|S|] long, distinct, sorted)."""
    V = head.out_features
    if not isinstance(vocabulary, torch.Tensor) or vocabulary.ndim != 1 or vocabulary.dtype != torch.long:
        raise TypeError("vocabulary must be a 1-D torch.long tensor of token ids")
    if vocabulary.numel() < 1 or int(vocabulary.min()) < 0 or int(vocabulary.max()) >= V or not bool(
            (vocabulary[1:] > vocabulary[:-1]).all()):
        raise ValueError(f"vocabulary must hold distinct sorted token ids in [0, {V}), got {vocabulary.numel()} ids")
    trimmed = torch.nn.Linear(head.in_features, vocabulary.numel(), bias=head.bias is not None,
                              device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        trimmed.weight.copy_(head.weight[vocabulary.to(head.weight.device)])
        if head.bias is not None:
            trimmed.bias.copy_(head.bias[vocabulary.to(head.weight.device)])
    return trimmed


def check_exit_layer(exit_layer, n_layers: int) -> None:
    """ValueError unless `exit_layer` is an int in [1, n_layers - 1]: an exit before the model's last layer."""
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer < n_layers:
        raise ValueError(f"exit_layer must be an int in [1, {n_layers - 1}] for a {n_layers}-layer model, got "
                         f"{exit_layer!r}")


def early_exit_view(model, exit_layer: int):
    """The first `exit_layer` layers of a transformers decoder LM plus its final norm and head, sharing all weights.

    Works for models whose backbone is `model.model` and runs `layers[: config.num_hidden_layers]` (Llama, Mistral,
    Qwen2, ... in transformers 5). The view has its own config, so it gets its own (shallower) cache.
    """
    check_exit_layer(exit_layer, model.config.num_hidden_layers)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = exit_layer
    backbone = copy.copy(model.model)
    backbone.config = config
    view = module_view(model)
    view._modules["model"] = backbone
    view.config = config
    return view


def kangaroo_view(target, adapter, exit_layer: int | None = None):
    """The draft model of Kangaroo: a causal LM sharing the target's embedding, first `exit_layer` layers (default:
    the adapter's `config.exit_layer`; a sorted adapter's other exits too) and LM head, with the adapter's block as
    its last layer and the adapter's norm as its final norm. It has its own config (so its own, shallower cache) and
    its own module dicts (the target's hooks do not fire)."""
    exit_layer = check_adapter(target, adapter, exit_layer)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = exit_layer + 1
    backbone = module_view(target.model)
    backbone._modules["layers"] = torch.nn.ModuleList([*target.model.layers[:exit_layer],
                                                       block_at(adapter.block, exit_layer)])
    backbone._modules["norm"] = adapter.norm
    backbone.config = config
    view = module_view(target)
    view._modules["model"] = backbone
    view.config = config
    return view


def check_adapter(target, adapter, exit_layer: int | None = None) -> int:
    """The exit a Kangaroo `adapter` drafts `target` from (`exit_layer`, one of those it was trained for; default
    its own), after checking that it reads the target's features; its attention then reads the masks the target's
    backbone builds for its own attention implementation."""
    # duck-typed: mmspec.models sits above the adapters
    if not all(hasattr(adapter, name) for name in ("block", "norm", "config", "exits")):
        raise TypeError(f"adapter must be a KangarooAdapter (mmspec.models.kangaroo), got {type(adapter).__name__}")
    exit_layer = adapter.config.exit_layer if exit_layer is None else exit_layer
    check_exit_layer(exit_layer, target.config.num_hidden_layers)
    if exit_layer not in adapter.exits:
        raise ValueError(f"the adapter was trained for exit layers {list(adapter.exits)}, not {exit_layer}")
    if adapter.config.hidden_size != target.config.hidden_size:
        raise ValueError(f"the adapter reads features of width {adapter.config.hidden_size}; the target's are "
                         f"{target.config.hidden_size} wide")
    adapter.block.self_attn.config._attn_implementation = target.config._attn_implementation
    return exit_layer


def block_at(block: torch.nn.Module, slot: int) -> torch.nn.Module:
    """A decoder layer sharing `block`'s weights whose attention keeps its keys and values in cache layer `slot`."""
    if block.self_attn.layer_idx == slot:
        return block
    view, attention = module_view(block), module_view(block.self_attn)
    attention.layer_idx = slot
    view._modules["self_attn"] = attention
    return view
