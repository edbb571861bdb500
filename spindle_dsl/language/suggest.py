"""Did-you-mean suggestions for misspelt names, keys and kinds.

A typo is the most common spec error, and the fix is almost always the closest declared name;
saying it saves the user a trip through the file. difflib's ratio is good enough for
identifiers this short, and a case-insensitive exact match (``Vision`` for ``vision``) wins
outright, and so does a word with two letters swapped.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate most like ``word``, or None when nothing is close enough."""
    pool = [c for c in dict.fromkeys(candidates) if c != word]
    for c in pool:
        if c.lower() == word.lower():
            return c
    for c in pool:  # swapped letters ("ml" for "lm") score low on ratio but are plain typos
        if len(word) > 1 and sorted(c.lower()) == sorted(word.lower()):
            return c
    matches = difflib.get_close_matches(word, pool, n=1, cutoff=cutoff)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` or the empty string, to append to a message."""
    best = closest(word, candidates)
    return f" (did you mean '{best}'?)" if best else ""
