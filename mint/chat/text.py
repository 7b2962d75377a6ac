"""Text normalization: the comparison form of a short answer, shared by graders and routers.

`normalize_text` is what the `normalized` grader compares, what a router model's answer is
matched against its candidates' labels by, and what a vote counts: the same answer written
with other case, punctuation or spacing is the same answer.
"""

from __future__ import annotations

import re
import unicodedata

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_text(text: str, *, remove_articles: bool = False) -> str:
    """Case, punctuation and whitespace removed from the comparison."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(char for char in text if not unicodedata.category(char).startswith("P"))
    if remove_articles:
        text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())
