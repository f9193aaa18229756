"""Where vLLM ends a generation, replayed over a saved prefix and its continuation.

A resumed sample is a new vLLM request whose prompt is ``prompt + prefix``. vLLM matches stop
strings only within a request's own output text, so a stop string that begins in the prefix and
ends in the continuation goes unseen and the sample runs past its stop; and a cut can race the
engine, so a prefix may already end the generation. Both are decided here by replaying vLLM's end
checks token by token over the whole completion: EOS and stop ids as its scheduler checks them
(with the generation config's extra EOS ids, which vLLM stops on besides the tokenizer's), stop
strings as its detokenizer matches them (text decoded incrementally after the prompt, special
tokens per ``skip_special_tokens`` / ``spaces_between_special_tokens``, earliest-ending stop string
first, none before ``min_tokens``).

What a record holds when a stop string ends it: every token up to and including the one that
completed the stop string, as vLLM's ``token_ids`` do in an uninterrupted run. vLLM trims the stop
string (or, with ``include_stop_str_in_output``, what follows it) from the *text* only; records
hold no text, so that option changes nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from partial_rollout.snapshot import SamplingSpec


class Ending(NamedTuple):
    """How vLLM would report the end of a generation at some token."""

    finish_reason: str
    stop_reason: int | str | None


@dataclass(frozen=True, kw_only=True)
class EosIds:
    """The end-of-sequence ids a vLLM engine stops on besides a request's own ``stop_token_ids``."""

    primary: int | None
    """The tokenizer's ``eos_token_id``: ends a generation with ``stop_reason`` None (unless ``ignore_eos``)."""
    generation: frozenset[int] = frozenset()
    """Further ids in the model's generation config (``eos_token_id``, an int or a list): vLLM adds
    them to every request's stop ids unless ``ignore_eos``, so they end it with the id as ``stop_reason``."""

    @classmethod
    def of_engine(cls, llm: Any) -> EosIds:
        """Read them as vLLM's input processor does: the tokenizer's EOS and the generation config's list."""
        primary = getattr(llm.get_tokenizer(), "eos_token_id", None)
        listed = llm.model_config.try_get_generation_config().get("eos_token_id")
        extra = {listed} if isinstance(listed, int) else set(listed or ())
        extra.discard(primary)
        return cls(primary=primary, generation=frozenset(int(t) for t in extra))


class StopScan:
    """vLLM's end checks for one sample, fed its completion one token at a time (prefix, then continuation)."""

    def __init__(self, sampling: SamplingSpec, *, prompt_token_ids: Sequence[int], tokenizer: Any, eos: EosIds) -> None:
        self._sampling = sampling
        self._eos = None if sampling.ignore_eos else eos.primary
        self._stop_ids = frozenset(sampling.stop_token_ids) | (frozenset() if sampling.ignore_eos else eos.generation)
        self._include_stop = bool(sampling.extra.get("include_stop_str_in_output", False))
        self._text: _Detokenizer | None = None
        if sampling.stop and tokenizer is not None and sampling.extra.get("detokenize", True):
            self._text = _Detokenizer(
                tokenizer,
                prompt_token_ids,
                skip_special_tokens=bool(sampling.extra.get("skip_special_tokens", True)),
                spaces_between_special_tokens=bool(sampling.extra.get("spaces_between_special_tokens", True)),
            )
        self.count = 0
        """Tokens of the completion seen so far."""
        self.text = ""
        """Their text as vLLM's detokenizer builds it (empty when no stop string needs it)."""

    @property
    def reads_text(self) -> bool:
        """True when stop strings are matched, so every continued token must pass through :meth:`push`."""
        return self._text is not None

    def push(self, token: int) -> Ending | None:
        """The next token of the completion; how the generation ends at it, if it does."""
        self.count += 1
        s = self._sampling
        end = None
        if self.count > s.min_tokens:  # earlier, vLLM masks every stop id out of the logits
            if token == self._eos:
                end = Ending("stop", None)
            elif token in self._stop_ids:
                end = Ending("stop", int(token))
        if end is None and self.count >= s.max_tokens:
            end = Ending("length", None)
        if self._text is None:
            return end
        before = len(self.text)
        if end is None or end.finish_reason != "stop" or self._include_stop:  # vLLM leaves a stop token undecoded
            self.text += self._text.next(int(token))
        if self.count > s.min_tokens and len(self.text) > before:
            hit = self._stop_string(before)
            if hit is not None:
                return Ending("stop", hit)
        return end

    def finish_in_prefix(self, token_ids: Sequence[int] | np.ndarray) -> tuple[int, Ending] | None:
        """Where a saved prefix already ends the generation: ``(tokens to keep, ending)``, else ``None``.

        A cut can race the engine: the prefix may end in EOS or a stop id, complete a stop string,
        or fill ``max_tokens``. Such a sample is finished, not resumed (vLLM would generate past its
        end). Call it first, on a fresh scan; after ``None``, the scan is ready for the continuation.
        """
        assert self.count == 0, "finish_in_prefix scans a completion from its start"
        if self._text is not None:
            for token in token_ids:
                end = self.push(int(token))
                if end is not None:
                    return self.count, end
            return None
        # token checks only: vectorised, since a resume may hold thousands of long prefixes
        ids = np.asarray(token_ids)
        stop_ids = [t for t in (self._eos, *self._stop_ids) if t is not None]
        start = self._sampling.min_tokens
        hits = np.flatnonzero(np.isin(ids[start:], stop_ids))
        if len(hits):
            self.count = start + int(hits[0])
            end = self.push(int(ids[self.count]))
            assert end is not None
            return self.count, end
        self.count = len(ids)
        return (self.count, Ending("length", None)) if self.count >= self._sampling.max_tokens else None

    def _stop_string(self, new_from: int) -> str | None:
        """The stop string that completes earliest within the text added after ``new_from``."""
        best: tuple[int, str] | None = None
        for stop in self._sampling.stop:
            at = self.text.find(stop, max(0, new_from + 1 - len(stop)))
            if at != -1 and (best is None or at + len(stop) < best[0]):
                best = (at + len(stop), stop)
        return None if best is None else best[1]


class _Detokenizer:
    """Incremental decoding as vLLM's output processor does it, primed with the prompt."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
    ) -> None:
        from transformers import TokenizersBackend

        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._spaces = spaces_between_special_tokens
        self._fast = isinstance(tokenizer, TokenizersBackend)  # vLLM's choice of detokenizer
        self._ids = [int(t) for t in prompt_token_ids]
        if self._fast:
            from tokenizers.decoders import DecodeStream

            self._backend = tokenizer.backend_tokenizer
            self._stream = DecodeStream(ids=self._ids, skip_special_tokens=self._skip)
            self._added: dict[int, str] = {}
            if not (self._skip or self._spaces):  # vLLM glues consecutive added tokens without a space
                self._added = {t: tok.content for t, tok in self._backend.get_added_tokens_decoder().items()}
            self._last_added = False
        else:
            from vllm.tokenizers.detokenizer_utils import convert_prompt_ids_to_tokens

            self._tokens, self._prefix_offset, self._read_offset = convert_prompt_ids_to_tokens(
                tokenizer=tokenizer, prompt_ids=self._ids, skip_special_tokens=self._skip
            )

    def next(self, token: int) -> str:
        if self._fast:
            piece = self._step(token)
            if self._added:
                added = self._added.get(token)
                if added is not None and self._last_added:
                    piece = added
                self._last_added = added is not None
            return str(piece)
        from vllm.tokenizers.detokenizer_utils import detokenize_incrementally

        self._ids.append(token)
        new_tokens, text, self._prefix_offset, self._read_offset = detokenize_incrementally(
            tokenizer=self._tokenizer,
            all_input_ids=self._ids,
            prev_tokens=self._tokens,
            prefix_offset=self._prefix_offset,
            read_offset=self._read_offset,
            skip_special_tokens=self._skip,
            spaces_between_special_tokens=self._spaces,
        )
        self._tokens.extend(new_tokens)
        return str(text)

    def _step(self, token: int) -> str:
        """One step of the decode stream, recovering where vLLM's fast detokenizer recovers."""
        try:
            return str(self._stream.step(self._backend, token) or "")
        except (OverflowError, TypeError):  # vLLM logs these and decodes the token as nothing
            return ""
        except Exception as error:
            if not str(error).startswith("Invalid prefix encountered"):
                raise
            from tokenizers.decoders import DecodeStream  # non-monotonic UTF-8: vLLM restarts the stream

            self._stream = DecodeStream(skip_special_tokens=self._skip)
            return str(self._stream.step(self._backend, token) or "")
