"""How a serving node of one base starts on this machine: what `mint serve --base NAME` hands
the node's app (`mint.api.node_app`, which imports nothing of serving).

`NodeHost(settings, base)` checks, before anything is loaded or registered, that this machine
can hold the base as its serving profile says (ConfigurationError otherwise, saying what the
base needs, instead of failing halfway through loading its weights). `open` then loads the
engine and starts the `ServingNode` on an adapter-cache folder, its cache's counters on a
Prometheus registry, and closes both on exit. Torch is imported by `open` only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry

from mint.config import Settings
from mint.schemas.base_models import get_base_model_spec
from mint.serving.node import ServingNode
from mint.storage.objects import object_store_for

log = logging.getLogger(__name__)


class NodeHost:
    """A serving node of `base_model` as this machine runs it; refused (ConfigurationError) where
    this machine cannot hold the base as its serving profile says."""

    def __init__(self, settings: Settings, base_model: str) -> None:
        from mint.serving.engines import choose_engine
        from mint.serving.fit import machine_resources, refuse_unless_fits

        self.settings = settings
        self.base_model = base_model
        self.spec = get_base_model_spec(base_model, settings.model_configs_dir)
        self.engine_kind = choose_engine(self.spec, settings.serving_engine, vllm_python=settings.vllm_python)
        refuse_unless_fits(self.spec.name, self.spec.serving, self.engine_kind, machine_resources())

    @contextmanager
    def open(self, ssd_dir: Path, registry: CollectorRegistry) -> Iterator[ServingNode]:
        """The node, its engine loaded and its cache on `ssd_dir`, counted on `registry`; stopped on exit."""
        from mint.serving.cache_stats import register_metrics
        from mint.serving.engines import open_engine

        settings = self.settings
        engine = open_engine(
            self.spec,
            settings.models_cache_dir,
            kind=self.engine_kind,
            vllm_python=settings.vllm_python,
            max_adapters=settings.serving_engine_slots,
            max_batch_size=settings.serving_batch_size,
            compute_dtype=settings.compute_dtype,
        )
        try:
            node = ServingNode(
                self.spec,
                engine,
                object_store_for(settings),
                ssd_dir=ssd_dir,
                max_waiting=settings.serving_max_waiting,
            )
            try:
                log.info("serving %s with the %s engine", self.base_model, type(engine).__name__)
                register_metrics(node.cache, registry)
                yield node
            finally:
                node.close()
        finally:
            engine.close()
