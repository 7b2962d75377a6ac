"""What `test_sharded_loading.py` and its ranks (`load_script.py`) share: the bases they load
and the probe whose logits they compare."""

from __future__ import annotations

from typing import Any

import torch

from mint.schemas.base_models import BaseModelSpec, Seeded


def variant(spec: BaseModelSpec, name: str, seed: int, **config: Any) -> BaseModelSpec:
    """`spec` (a seeded base) under another name and seed, with `config` over its model config."""
    assert isinstance(spec.source, Seeded)
    source = spec.source.model_copy(update={"seed": seed, "config": {**spec.source.config, **config}})
    return spec.model_copy(update={"name": name, "source": source})


def probe_logits(model: Any) -> torch.Tensor:
    """The model's logits over two rows of 24 tokens: (2, 24, vocab), float32, on CPU."""
    tokens_B_T = torch.tensor([list(range(100, 124)), list(range(9000, 9024))])
    with torch.no_grad():
        return model(input_ids=tokens_B_T).logits.float().cpu().contiguous()
