"""Lists that page themselves: `for job in client.jobs.list(): ...` walks every page.

Mint's lists are OpenAI's: a page holds `data` and `has_more`, and the next page starts
`after` the last id of this one. `SyncPager` and `AsyncPager` fetch a page only when the
loop reaches it, so breaking out early costs nothing more.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import httpx

from mint.schemas.common import Page
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP


class HasId(Protocol):
    @property
    def id(self) -> str: ...


ItemT = TypeVar("ItemT", bound=HasId)

# The request for the page after a cursor (None: the first page).
PageCall = Callable[[str | None], Call[Page[Any]]]


def bind_items(call: Call[Page[Any]], bind: Callable[[Any], Any]) -> Call[Page[Any]]:
    """`call`, whose page has each item passed through `bind` (which ties it to its resource,
    so that `job.wait()` works on an item of a list)."""

    def parse(response: httpx.Response) -> Page[Any]:
        page = call.parse(response)
        for item in page.data:
            bind(item)
        return page

    return Call(call.method, call.path, parse, call.params)


def next_cursor(page: Page[Any]) -> str | None:
    """Where the next page starts, or None after the last page."""
    if not page.has_more or not page.data:
        return None
    return page.last_id or str(page.data[-1].id)


class SyncPager(Generic[ItemT]):
    """Every item of a list, page after page, fetched as the loop needs them."""

    def __init__(self, http: SyncHTTP, page_call: PageCall) -> None:
        self._http = http
        self._page_call = page_call

    def pages(self) -> Iterator[Page[ItemT]]:
        """The pages themselves, for callers that want `has_more` or page boundaries."""
        cursor: str | None = None
        while True:
            page: Page[ItemT] = self._http.send(self._page_call(cursor))
            yield page
            cursor = next_cursor(page)
            if cursor is None:
                return

    def first_page(self) -> Page[ItemT]:
        return next(iter(self.pages()))

    def __iter__(self) -> Iterator[ItemT]:
        for page in self.pages():
            yield from page.data


class AsyncPager(Generic[ItemT]):
    """Every item of a list, page after page: `async for item in client.jobs.list(): ...`."""

    def __init__(self, http: AsyncHTTP, page_call: PageCall) -> None:
        self._http = http
        self._page_call = page_call

    async def pages(self) -> AsyncIterator[Page[ItemT]]:
        cursor: str | None = None
        while True:
            page: Page[ItemT] = await self._http.send(self._page_call(cursor))
            yield page
            cursor = next_cursor(page)
            if cursor is None:
                return

    async def first_page(self) -> Page[ItemT]:
        async for page in self.pages():
            return page
        raise AssertionError("a list always has a first page")

    async def __aiter__(self) -> AsyncIterator[ItemT]:
        async for page in self.pages():
            for item in page.data:
                yield item

    async def to_list(self) -> list[ItemT]:
        """Every item, all pages fetched."""
        return [item async for item in self]
