"""The confidence rule's tie-break turned around, one implementation for the tests that must
see it fail (the saturated parity fixtures, `make check`'s injected regressions)."""

from __future__ import annotations


def earlier_wins(select):
    """``select`` (``select_by_confidence``'s signature) with ties among equally confident
    positions going to the earlier one instead of the later: the row is ranked backwards and
    the chosen indices mapped back."""

    def ties_to_the_earlier(confidence, decoded, k, threshold, **options):
        backwards = None if decoded is None else decoded[::-1]
        chosen = select(confidence[::-1], backwards, k, threshold, **options)
        return sorted(len(confidence) - 1 - i for i in chosen)

    return ties_to_the_earlier
