"""What can be sent as `model`: `/v1/models` (bases, adapter versions `name@N` and deployments,
as OpenAI lists models) and `/v1/base_models` (the platform's base registry, with how each
base can be adapted)."""

from __future__ import annotations

import builtins

from mint.schemas.base_models import BaseModelPublic
from mint.schemas.inference import ModelCard, ModelList
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_list, parse_model


def list_models() -> Call[ModelList]:
    return Call("GET", "/v1/models", parse_model(ModelList))


def get_model(model: str) -> Call[ModelCard]:
    return Call("GET", f"/v1/models/{model}", parse_model(ModelCard))


def list_bases() -> Call[list[BaseModelPublic]]:
    return Call("GET", "/v1/base_models", parse_list(BaseModelPublic))


def get_base(name: str) -> Call[BaseModelPublic]:
    return Call("GET", f"/v1/base_models/{name}", parse_model(BaseModelPublic))


class Models:
    """`/v1/models`: every model this organization can send to chat and evals."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def list(self) -> builtins.list[ModelCard]:
        return self._http.send(list_models()).data

    def get(self, model: str) -> ModelCard:
        return self._http.send(get_model(model))


class BaseModels:
    """`/v1/base_models`: the bases of the platform's registry (the same for every organization)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def list(self) -> builtins.list[BaseModelPublic]:
        return self._http.send(list_bases())

    def get(self, name: str) -> BaseModelPublic:
        return self._http.send(get_base(name))


class AsyncModels:
    """`/v1/models`, for asyncio: the twin of `Models`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def list(self) -> builtins.list[ModelCard]:
        return (await self._http.send(list_models())).data

    async def get(self, model: str) -> ModelCard:
        return await self._http.send(get_model(model))


class AsyncBaseModels:
    """`/v1/base_models`, for asyncio: the twin of `BaseModels`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def list(self) -> builtins.list[BaseModelPublic]:
        return await self._http.send(list_bases())

    async def get(self, name: str) -> BaseModelPublic:
        return await self._http.send(get_base(name))
