"""When a row stops: EOS, stop strings or regexes, repeated tokens, or its token budget.

Rules look only at the generated tokens (never the prompt), and only at the contiguous decoded
prefix of the generated region: a diffusion family may decode a later position first, but a
stop is only real once everything before it is decoded. The stop point is exact: the row's
output (and its counted tokens) ends at the token that completed the stop condition.
"""

from __future__ import annotations

import re

from setdlm.core.decoding.config import DecodeConfig


class StopRule:
    def __init__(self, config: DecodeConfig, tokenizer=None):
        self.eos = frozenset(config.eos_token_ids)
        self.repeats = config.stop_repeated_tokens
        patterns = [re.escape(text) for text in config.stop_strings] + list(config.stop_regexes)
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        if self.pattern is not None and tokenizer is None:
            raise ValueError("stop_strings / stop_regexes need a tokenizer to decode text")
        self.tokenizer = tokenizer

    @property
    def active(self) -> bool:
        return bool(self.eos or self.repeats or self.pattern is not None)

    def stop_point(self, generated: list[int], already_checked: int) -> int | None:
        """Length of the output if ``generated`` (a decoded prefix) meets a stop condition.

        Only tokens from ``already_checked`` on are new, so a condition is searched for among
        prefixes ending at a new token; the shortest such prefix wins.
        """
        candidates = []
        for end in range(already_checked + 1, len(generated) + 1):
            token = generated[end - 1]
            repeated = (
                self.repeats
                and end >= self.repeats
                and len(set(generated[end - self.repeats : end])) == 1
            )
            if token in self.eos or repeated:
                candidates.append(end)
                break
        new_tokens = len(generated) > already_checked
        if new_tokens and self.pattern is not None and self.pattern.search(self._text(generated)):
            for end in range(already_checked + 1, len(generated) + 1):
                if self.pattern.search(self._text(generated[:end])) is not None:
                    candidates.append(end)
                    break
        return min(candidates) if candidates else None

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)
