"""A decode step for dense Llama-family bases that computes what the transformers model and peft
compute, in a fraction of the operations.

A decode step is one token for each of a few rows: every matrix product is small, and on a CPU
the model's own forward spends as long in the Python and the small operations around its
products (peft's per-adapter loops, dtype casts, views, per-projection LoRA terms) as in the
base's products themselves (measured on SmolLM2-135M, 16 rows: 130 ms a step, of which 62 ms
are the base's and the head's products). `FusedDecoder.step` runs the same layers directly:

- each projection is one `addmm` of the base weight onto its LoRA term;
- the LoRA terms of the projections that read the same input (q, k and v; gate and up) are
  computed together: one product by the A matrices of every adapter in the batch stacked, a
  mask that keeps each row's own adapter's part, one product by the B matrices laid out block
  diagonally, with the scaling folded in. Rows of several adapters (a mixed pass,
  `mixed_adapters`) and rows of the base alone (a zero mask) share the same two products;
- norms, rotary embeddings and attention are the model's own modules and functions, so the
  numbers match the model's forward up to float rounding.

Only the decode steps run here; prefill runs through the model as before, and the step reads
and writes the same KV cache (`kv_cache.PreallocatedLayer`). `FusedDecoder.of` returns None for
what it does not cover (MoE bases, other architectures, adapters on parameters, DoRA, a cache
layer of another kind), and the caller keeps the model's own forward.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mint.trainer.kv_cache import PreallocatedLayer
from mint.trainer.packing import ROW_ATTENTION

# transformers model types whose decoder layers are Llama's: RMSNorm, rotary attention (with
# per-head q/k norms on Qwen3), a gated SiLU MLP; attention and MLP biases are read from the layers.
FUSABLE_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3"})
# Attention implementations a step calls as the model would, with a boolean mask: transformers'
# sdpa, and Mint's row attention (`packing`), which is sdpa in any pass but a training pass of
# data end to end.
_ATTENTION_IMPLEMENTATIONS = frozenset({"sdpa", ROW_ATTENTION})
_ATTENTION_INPUTS = ("q_proj", "k_proj", "v_proj")
_MLP_INPUTS = ("gate_proj", "up_proj")


@dataclass
class _Projections:
    """Linear layers that read one input, with the LoRA terms of every adapter in the batch:
    `a_K_I` stacks each adapter's A over its projections (rank rows per adapter and projection),
    `b_O_K` lays each one's B (times its scaling) out block diagonally, so that
    `((x @ a_K_I.T) * mask) @ b_O_K.T` is every row's own LoRA term for all the projections.
    Both are kept transposed, as the products read them."""

    weights_I_O: list[torch.Tensor]  # each base weight, transposed (a view)
    biases: list[torch.Tensor | None]
    widths: list[int]
    a_I_K: torch.Tensor | None
    b_K_O: torch.Tensor | None
    # For each adapter index (the order of `FusedDecoder.adapters`), its columns [start, stop) of K.
    columns: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, modules: Sequence[nn.Module], adapters: Sequence[str]) -> _Projections:
        weights_I_O, biases, a_blocks, b_rows, columns = [], [], [], [], {}
        rank_total = 0
        for index, adapter in enumerate(adapters):
            start = rank_total
            for module in modules:
                if adapter in getattr(module, "lora_A", {}):
                    a_blocks.append(module.lora_A[adapter].weight)
                    b_rows.append((module, adapter, rank_total))
                    rank_total += module.lora_A[adapter].weight.shape[0]
            if rank_total > start:
                columns[index] = (start, rank_total)
        for module in modules:
            base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
            weights_I_O.append(base.weight.T)
            biases.append(base.bias)
        widths = [weight.shape[1] for weight in weights_I_O]
        if not rank_total:
            return cls(weights_I_O, biases, widths, None, None, {})
        a_K_I = torch.cat(a_blocks)
        b_O_K = a_K_I.new_zeros((sum(widths), rank_total))
        offsets = dict(zip(modules, [sum(widths[:i]) for i in range(len(widths))], strict=True))
        for module, adapter, column in b_rows:
            b = module.lora_B[adapter].weight * module.scaling[adapter]
            row = offsets[module]
            b_O_K[row : row + b.shape[0], column : column + b.shape[1]] = b
        return cls(weights_I_O, biases, widths, a_K_I.T, b_O_K.T, columns)

    def __call__(self, x_B_I: torch.Tensor, mask_B_K: torch.Tensor | bool) -> list[torch.Tensor]:
        """Each projection of `x_B_I`, with each row's own adapter's LoRA term: `mask_B_K` keeps
        each row's columns (`mask`); True: every row is the one adapter's; False: the base's."""
        if self.a_I_K is None or mask_B_K is False:
            return [
                torch.nn.functional.linear(x_B_I, weight.T, bias)
                for weight, bias in zip(self.weights_I_O, self.biases, strict=True)
            ]
        lora_B_K = x_B_I.to(self.a_I_K.dtype) @ self.a_I_K
        if mask_B_K is not True:
            lora_B_K = lora_B_K * mask_B_K
        deltas = (lora_B_K @ self.b_K_O).to(x_B_I.dtype).split(self.widths, dim=-1)
        return [
            torch.addmm(delta if bias is None else delta + bias, x_B_I, weight)
            for weight, bias, delta in zip(self.weights_I_O, self.biases, deltas, strict=True)
        ]

    def mask(self, adapter_of_row: Sequence[int | None], device: torch.device) -> torch.Tensor | bool:
        """What `__call__` takes to give each row its own adapter's LoRA term (None: the base)."""
        if self.a_I_K is None or all(adapter not in self.columns for adapter in adapter_of_row):
            return False
        if len(self.columns) == 1 and all(adapter in self.columns for adapter in adapter_of_row):
            return True
        mask_B_K = torch.zeros((len(adapter_of_row), self.a_I_K.shape[1]), dtype=self.a_I_K.dtype, device=device)
        for row, adapter in enumerate(adapter_of_row):
            if adapter in self.columns:
                start, stop = self.columns[adapter]
                mask_B_K[row, start:stop] = 1
        return mask_B_K


@dataclass
class _Layer:
    module: nn.Module  # the transformers decoder layer: its norms, its attention's settings
    qkv: _Projections
    output: _Projections
    gate_up: _Projections
    down: _Projections


def _plain_linear(module: nn.Module) -> bool:
    """A plain linear layer, or peft's LoRA wrapper of one, unmerged and without DoRA or LoRA bias."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    if type(module) is nn.Linear:
        return True
    if type(module) is not LoraLinear or type(module.get_base_layer()) is not nn.Linear or module.merged:
        return False
    return not any(module.use_dora.values()) and not any(getattr(module, "lora_bias", {}).values())


def _adapted_modules(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [module for module in model.modules() if isinstance(module, BaseTunerLayer)]


class FusedDecoder:
    """Decode steps of a dense Llama-family model, each request's rows through its owner's adapter
    (None: the base), as `sampling.generate_batch` runs them."""

    def __init__(self, model: nn.Module, owners: Sequence[str | None]) -> None:
        self.owners = list(owners)
        self.adapters = sorted({owner for owner in owners if owner is not None})
        decoder = model.model
        self.embed = decoder.embed_tokens
        self.norm = decoder.norm
        self.rotary = decoder.rotary_emb
        self.layers = [
            _Layer(
                module=layer,
                qkv=_Projections.of([getattr(layer.self_attn, name) for name in _ATTENTION_INPUTS], self.adapters),
                output=_Projections.of([layer.self_attn.o_proj], self.adapters),
                gate_up=_Projections.of([getattr(layer.mlp, name) for name in _MLP_INPUTS], self.adapters),
                down=_Projections.of([layer.mlp.down_proj], self.adapters),
            )
            for layer in decoder.layers
        ]
        self.head = _Projections.of([model.lm_head], self.adapters)
        attention = decoder.layers[0].self_attn
        self._rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb
        self._attend = _attention_function(model.config)
        self._masks: tuple[tuple[Any, ...], list[torch.Tensor | bool]] | None = None

    @classmethod
    def of(cls, model: nn.Module, owners: Sequence[str | None]) -> FusedDecoder | None:
        """A decoder for `model` (a transformers model, perhaps wrapped by peft) whose requests
        run through `owners` (by request index; None: the base), or None where the model's own
        forward must run: another architecture, or an adapted layer other than a plain linear."""
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = getattr(inner, "config", None)
        if getattr(config, "model_type", None) not in FUSABLE_MODEL_TYPES or inner.training:
            return None
        if getattr(config, "_attn_implementation", None) not in _ATTENTION_IMPLEMENTATIONS:
            return None
        adapted = _adapted_modules(inner)
        if not all(_plain_linear(module) for module in adapted):
            return None
        adapters = {owner for owner in owners if owner is not None}
        for module in adapted:
            for adapter in adapters & set(module.lora_dropout):
                dropout = module.lora_dropout[adapter]
                if dropout.training and not isinstance(dropout, nn.Identity):
                    return None  # a LoRA dropout live in the model's forward (a training pass)
        if type(inner.model.embed_tokens) is not nn.Embedding:
            return None
        return cls(inner, owners)

    def fits(self, cache: Any) -> bool:
        """Whether every layer of `cache` is one this step writes into (`kv_cache.reserve`'s)."""
        layers = getattr(cache, "layers", ())
        return len(layers) == len(self.layers) and all(type(layer) is PreallocatedLayer for layer in layers)

    def _row_masks(self, rows: Sequence[tuple[int, int]], device: torch.device) -> list[torch.Tensor | bool]:
        """Each projection group's row mask for these live (request index, rows), kept while the
        live rows stay the same."""
        key = tuple(rows)
        if self._masks is None or self._masks[0] != key:
            index = {name: i for i, name in enumerate(self.adapters)}
            adapter_of_row = [
                None if self.owners[request] is None else index[self.owners[request]]
                for request, count in rows
                for _ in range(count)
            ]
            groups = [group for layer in self.layers for group in _groups(layer)] + [self.head]
            self._masks = (key, [group.mask(adapter_of_row, device) for group in groups])
        return self._masks[1]

    def step(
        self,
        rows: Sequence[tuple[int, int]],
        input_ids_B: torch.Tensor,
        attention_mask_B_W: torch.Tensor,
        positions_B: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """The next-token logits (B, V) of one decode step: `input_ids_B` at `positions_B` for the
        live requests' rows `rows` (request index, rows, in batch order), attending to the cache
        and themselves under `attention_mask_B_W`; each layer's new keys and values go into `cache`."""
        masks = iter(self._row_masks(rows, input_ids_B.device))
        hidden_B_H = self.embed(input_ids_B)
        count = hidden_B_H.shape[0]
        cos, sin = self.rotary(hidden_B_H, positions_B.unsqueeze(-1))
        visible_B_1_1_W = attention_mask_B_W.bool()[:, None, None, :]
        for layer, cache_layer in zip(self.layers, cache.layers, strict=True):
            attention = layer.module.self_attn
            head_dim = attention.head_dim
            normed_B_H = layer.module.input_layernorm(hidden_B_H)
            query, key, value = (
                projected.view(count, 1, -1, head_dim) for projected in layer.qkv(normed_B_H, next(masks))
            )
            if hasattr(attention, "q_norm"):
                query, key = attention.q_norm(query), attention.k_norm(key)
            query, key = self._rotate(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
            keys, values = cache_layer.update(key, value.transpose(1, 2))
            attended, _ = self._attend(
                attention, query, keys, values, visible_B_1_1_W, dropout=0.0, scaling=attention.scaling
            )
            (out_B_H,) = layer.output(attended.reshape(count, -1), next(masks))
            hidden_B_H = hidden_B_H + out_B_H
            normed_B_H = layer.module.post_attention_layernorm(hidden_B_H)
            gate, up = layer.gate_up(normed_B_H, next(masks))
            mlp = layer.module.mlp
            (down_B_H,) = layer.down(mlp.act_fn(gate) * up, next(masks))
            hidden_B_H = hidden_B_H + down_B_H
        (logits_B_V,) = self.head(self.norm(hidden_B_H), next(masks))
        return logits_B_V


def _groups(layer: _Layer) -> tuple[_Projections, ...]:
    return layer.qkv, layer.output, layer.gate_up, layer.down


def _attention_function(config: Any) -> Callable[..., tuple[torch.Tensor, Any]]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[config._attn_implementation]
