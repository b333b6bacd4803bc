"""BERT WordPiece tokenization in bulk, equal to the Rust ``tokenizers`` output.

    rust = load_tokenizer(tokenizer_json, 256)
    tokenize = fast_token_arrays(rust, 256, partial(token_arrays, rust))  # None unless BERT-like
    flat, lengths = tokenize(texts)     # == token_arrays(rust, texts)

Why: the Rust tokenizer builds a full ``Encoding`` per text (token strings, offsets, masks), so feeding a GPU
encoder at its rate would take tens of cores (measurements in the performance docs). For ASCII text without control characters, BERT's normalizer and pre-tokenizer reduce to
"lowercase, split on whitespace, isolate ASCII punctuation", which ``str.lower`` / ``str.translate`` /
``str.split`` do on a whole batch at once in C; each distinct word is cut into word pieces once and
remembered, and the ids are assembled with NumPy. Other texts are first rewritten character by character
(``str.translate``) with rules learned from the Rust normalizer and pre-tokenizer themselves, one
character at a time (``_CharRules``). Texts with a character whose rule depends on its neighbours, or that
could contain an added token such as ``[MASK]``, go to the Rust tokenizer, so the output is always the
Rust tokenizer's.

Covered: ``BertNormalizer`` (any options), ``BertPreTokenizer``, a ``WordPiece`` model, and a
``TemplateProcessing`` / ``BertProcessing`` / absent post-processor that wraps a single sequence in special
tokens; truncation on the right.
"""

from __future__ import annotations

import json
import string
import threading
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["FastWordPiece", "fast_token_arrays"]

_CONTROL = "".join(chr(c) for c in (*range(0, 9), 11, 12, *range(14, 32), 127))  # dropped by BERT's clean_text
_DELETE_CONTROL = str.maketrans("", "", _CONTROL)
_ISOLATE_PUNCT = str.maketrans({c: f" {c} " for c in string.punctuation})  # BertPreTokenizer's ASCII punctuation
_SEPARATOR = "\x00"  # joins the texts of a batch; a control character, so never part of an accepted text
_JOIN = f" {_SEPARATOR} "
_UNSAFE = "\x01"  # what _CharRules maps a character to when its text must go to the Rust tokenizer
MAX_CACHED_WORDS = 500_000  # distinct words remembered beyond the vocabulary (then forgotten and relearned)


def _wrapping_ids(spec: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """The special-token ids the post-processor puts before / after a single sequence."""
    post = spec.get("post_processor")
    if post is None:
        return [], []
    if post.get("type") == "BertProcessing":
        return [post["cls"][1]], [post["sep"][1]]
    if post.get("type") != "TemplateProcessing":
        return None
    before: list[int] = []
    after: list[int] = []
    seen_sequence = False
    for piece in post["single"]:
        if "Sequence" in piece:
            if seen_sequence:
                return None
            seen_sequence = True
        else:
            (after if seen_sequence else before).extend(post["special_tokens"][piece["SpecialToken"]["id"]]["ids"])
    return (before, after) if seen_sequence else None


class FastWordPiece:
    """Callable texts -> (flat int32 token ids, lengths int64), as ``token_arrays`` on ``fallback`` (the
    Rust tokenizer of the same JSON, truncation set), which tokenizes the texts this class does not cover."""

    def __init__(self, vocab: dict[str, int], unk_token: str, prefix: str, max_chars: int, lowercase: bool,
                 wrap: tuple[list[int], list[int]], added: list[str], max_length: int, rust: Any,
                 fallback: Callable[[list[str]], tuple[np.ndarray, np.ndarray]]) -> None:
        self.vocab, self.unk, self.prefix, self.max_chars, self.lowercase = vocab, vocab[unk_token], prefix, max_chars, lowercase
        self.before, self.after = np.asarray(wrap[0], np.int32), np.asarray(wrap[1], np.int32)
        self.room = max_length - len(wrap[0]) - len(wrap[1])  # tokens of the text itself
        self.added = [a.lower() for a in added if a]  # texts that might hold an added token go to Rust
        self.fallback, self._chars = fallback, _CharRules(rust)
        self.n_vocab = max(vocab.values()) + 1
        self.max_cached_words = MAX_CACHED_WORDS  # learned words kept beyond the vocabulary (then forgotten)
        self.forgotten = -1  # times the learned words were forgotten (the first _reset is the start)
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        """Forget the learned words. Entry e covers table[start[e]:start[e] + length[e]]: entries below
        n_vocab are the single tokens themselves, n_vocab is the separator (no tokens)."""
        n = self.n_vocab
        self.forgotten += 1
        self._table = np.arange(n, dtype=np.int32)
        self._start = np.concatenate([np.arange(n), [0]]).astype(np.int64)
        self._length = np.concatenate([np.ones(n), [0]]).astype(np.int64)
        self._entries, self._used = n + 1, n
        self._words = _Words(self._entry)
        self._words.update((w, i) for w, i in self.vocab.items() if not w.startswith(self.prefix) and len(w) <= self.max_chars)
        self._words[_SEPARATOR] = n

    @property
    def known_words(self) -> int:
        """Words it maps without cutting them into pieces again: vocabulary words and the learned ones."""
        return len(self._words)

    # ------------------------------------------------------------------ words -> entries
    def _pieces(self, word: str) -> list[int]:
        """WordPiece: greedy longest match from the left; a word with an unmatched rest is one unknown token."""
        if len(word) > self.max_chars:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    pieces.append(self.vocab[piece])
                    start = end
                    break
            else:
                return [self.unk]
        return pieces

    def _entry(self, word: str) -> int:
        pieces = self._pieces(word)
        if len(pieces) == 1:
            entry = pieces[0]
        else:
            entry = self._add_entry(pieces)
        self._words[word] = entry  # (__call__ forgets them all past max_cached_words)
        return entry

    def _add_entry(self, pieces: list[int]) -> int:
        if self._entries == len(self._start):
            self._start = np.resize(self._start, 2 * self._entries)
            self._length = np.resize(self._length, 2 * self._entries)
        if self._used + len(pieces) > len(self._table):
            self._table = np.resize(self._table, 2 * (self._used + len(pieces)))
        entry, self._entries = self._entries, self._entries + 1
        self._start[entry], self._length[entry] = self._used, len(pieces)
        self._table[self._used:self._used + len(pieces)] = pieces
        self._used += len(pieces)
        return entry

    # ------------------------------------------------------------------ texts
    def covers(self, text: str) -> bool:
        """Is ``text`` tokenized here (True) or handed to the Rust tokenizer (False)?"""
        return self._plain(text, 0) or self._mapped(text) is not None

    def _plain(self, joined: str, separators: int) -> bool:
        """ASCII without control characters (but the ``separators``) and without added tokens."""
        if not joined.isascii() or len(joined) - len(joined.translate(_DELETE_CONTROL)) != separators:
            return False
        lowered = joined.lower()
        return not any(a in lowered for a in self.added)

    def _mapped(self, text: str) -> str | None:
        """``text`` normalized and pre-tokenized character by character (words separated by spaces), or
        None when a character's rule depends on its neighbours or the text may hold an added token."""
        mapped = text.translate(self._chars)
        if _UNSAFE in mapped:
            return None
        lowered, mapped_lower = text.lower(), mapped.lower()
        return None if any(a in lowered or a in mapped_lower for a in self.added) else mapped

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """texts [n] -> (flat int32 [sum lengths] token ids, lengths int64 [n]), the Rust tokenizer's ids.
        Thread-safe (one call at a time: the learned words are shared)."""
        texts = texts if isinstance(texts, list) else list(texts)
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        with self._lock:
            return self._call(texts)

    def _call(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if len(self._words) >= self.max_cached_words:
            self._reset()
        joined = _JOIN.join(texts)
        if self._plain(joined, len(texts) - 1):  # the common case: one pass over the whole batch
            return self._tokenize_joined(joined, len(texts), mapped=False)
        plain, mapped, rust = [], [], []
        for row, text in enumerate(texts):
            if self._plain(text, 0):
                plain.append(row)
            elif (m := self._mapped(text)) is not None:
                mapped.append((row, m))
            else:
                rust.append(row)
        parts = [(np.asarray(plain, np.int64), self._tokenize_joined(_JOIN.join(texts[r] for r in plain), len(plain), mapped=False)),
                 (np.asarray([r for r, _ in mapped], np.int64),
                  self._tokenize_joined(_JOIN.join(m for _, m in mapped), len(mapped), mapped=True))]
        if rust:
            parts.append((np.asarray(rust, np.int64), self.fallback([texts[r] for r in rust])))
        return _interleave(parts, len(texts))

    def _tokenize_joined(self, joined: str, n: int, mapped: bool) -> tuple[np.ndarray, np.ndarray]:
        """Texts joined by ``_JOIN`` -> token arrays. ``mapped``: already normalized and pre-tokenized
        (``_mapped``); else plain ASCII, lowercased and split here."""
        if n == 0:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        if not mapped:
            joined = (joined.lower() if self.lowercase else joined).translate(_ISOLATE_PUNCT)
        words = joined.split()
        codes = np.fromiter(map(self._words.__getitem__, words), np.int64, len(words))  # C loop; misses: _entry
        return self._assemble(codes, n)

    def _assemble(self, codes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Word entries (separators between texts) -> truncated, wrapped token ids per text."""
        counts = self._length[codes]
        text = np.cumsum(codes == self.n_vocab)  # text of each word
        per_text = np.bincount(text, weights=counts, minlength=n).astype(np.int64)
        total = int(per_text.sum())
        word_end = np.cumsum(counts)
        tokens = self._table[np.repeat(self._start[codes] - (word_end - counts), counts) + np.arange(total)]
        text_start = np.cumsum(per_text) - per_text
        token_text = np.repeat(np.arange(n), per_text)
        position = np.arange(total) - text_start[token_text]
        keep = position < self.room
        kept = np.minimum(per_text, self.room)
        lengths = kept + len(self.before) + len(self.after)
        out_start = np.cumsum(lengths) - lengths
        flat = np.empty(int(lengths.sum()), np.int32)
        flat[out_start[token_text[keep]] + len(self.before) + position[keep]] = tokens[keep]
        for j, token in enumerate(self.before):
            flat[out_start + j] = token
        for j, token in enumerate(self.after):
            flat[out_start + len(self.before) + kept + j] = token
        return flat, lengths


class _CharRules(dict):
    """ord -> what the Rust tokenizer's normalizer and pre-tokenizer make of that character alone: its
    normalized form with a space wherever the pre-tokenizer cuts (so "," -> " , ", a space -> " ", "É" ->
    "e", a control character -> ""), learned on first sight; ``_UNSAFE`` where the rule depends on the
    neighbours: surrogates, the separators, capital sigma (a final form exists), combining characters
    that normalization keeps (NFD may reorder them), forms that Python's ``str.split`` would cut otherwise."""

    def __init__(self, rust: Any) -> None:
        super().__init__()
        self.normalizer, self.pre_tokenizer = rust.normalizer, rust.pre_tokenizer

    def __missing__(self, code: int) -> str:
        self[code] = rule = self._rule(chr(code))
        return rule

    def _rule(self, char: str) -> str:
        if char in (_SEPARATOR, _UNSAFE, "\u03a3") or 0xD800 <= ord(char) <= 0xDFFF:
            return _UNSAFE
        norm = self.normalizer.normalize_str(char) if self.normalizer is not None else char
        if any(unicodedata.combining(c) or c in (_SEPARATOR, _UNSAFE) for c in norm):
            return _UNSAFE
        pieces = [p for p, _ in self.pre_tokenizer.pre_tokenize_str(f"a{norm}a")]
        rule = " ".join(pieces)[1:-1]  # the "a"s show whether the character joins its neighbours' words
        return rule if f"a{rule}a".split() == pieces else _UNSAFE


class _Words(dict):
    """word -> entry; a missing word is cut into pieces (and remembered) by ``learn``."""

    def __init__(self, learn: Callable[[str], int]) -> None:
        super().__init__()
        self.learn = learn

    def __missing__(self, word: str) -> int:
        return self.learn(word)


def _interleave(parts: list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, (flat, lengths)) parts covering rows 0..n-1 once -> one (flat, lengths) in row order."""
    lengths = np.zeros(n, np.int64)
    for rows, (_, part_lengths) in parts:
        lengths[rows] = part_lengths
    starts = np.cumsum(lengths) - lengths
    flat = np.empty(int(lengths.sum()), np.int32)
    for rows, (part_flat, part_lengths) in parts:
        offsets = np.cumsum(part_lengths) - part_lengths
        flat[np.repeat(starts[rows] - offsets, part_lengths) + np.arange(len(part_flat))] = part_flat
    return flat, lengths


def fast_token_arrays(rust: Any, max_length: int,
                      fallback: Callable[[list[str]], tuple[np.ndarray, np.ndarray]]) -> FastWordPiece | None:
    """A ``FastWordPiece`` for the Rust ``tokenizers.Tokenizer`` ``rust`` (truncating to ``max_length``), or
    None when it is not a BERT WordPiece tokenizer this module covers. ``fallback``: ``token_arrays`` on ``rust``."""
    spec = json.loads(rust.to_str())
    norm, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    wrap = _wrapping_ids(spec)
    if (norm.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer" or model.get("type") != "WordPiece"
            or wrap is None or max_length <= len(wrap[0]) + len(wrap[1]) or model.get("unk_token") not in model.get("vocab", {})):
        return None
    added = [a["content"] for a in spec.get("added_tokens") or []]
    return FastWordPiece(model["vocab"], model["unk_token"], model.get("continuing_subword_prefix", "##"),
                         model.get("max_input_chars_per_word", 100), bool(norm.get("lowercase", True)), wrap, added,
                         max_length, rust, fallback)
