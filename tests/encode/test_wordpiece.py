"""The bulk WordPiece path gives exactly the Rust tokenizer's ids: on plain ASCII text, on text it maps character
by character (non-ASCII, control characters), on text it hands to Rust (added tokens, context-dependent
characters), mixed in one call, for tokenizer variants and
truncation lengths, and after forgetting its learned words."""

from __future__ import annotations

import functools
import json
import random
import string

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from lsr.encode.tokenize import wordpiece
from lsr.encode.tokenize.pool import load_tokenizer, token_arrays
from lsr.encode.tokenize.wordpiece import fast_token_arrays

_PLAIN = string.printable.replace("\x0b", "").replace("\x0c", "")  # printable ASCII without the two control chars
# control and format characters, accents (precomposed and combining), CJK, Hangul, Greek (capital sigma has a
# final form), ligatures, typographic punctuation, symbols, spaces, a combining mark NFD reorders, mojibake
_ODD = ("\x00\x01\x0b\x0c\x1f\x7f\u0085\u00ad\u200b\ufffd" "\u00e9\u00c9\u00dc\u0301\u0327" "\u4e2d\u6587\uac00"
        "\u03a3\u03c3\u03b2\u00b5\ufb01\uff21" "\u2013\u2019\u201c\u00bf\u00a7" "\u20ac\u2265\U0001f600"
        "\u00a0\u2028\u3000" "\U0001d165" "\u00e2\u20ac\u2122")


@pytest.fixture(scope="module")
def spec(data_dir) -> dict:
    return json.loads((data_dir / "bert-base-uncased" / "tokenizer.json").read_text(encoding="utf-8"))


def _random_texts(seed: int, n: int, words: list[str], odd: float) -> list[str]:
    """Vocabulary words (some upper-cased), random alphanumeric runs (word pieces, unknown words), printable
    ASCII with punctuation, words around the 100-character limit; with probability ``odd`` per text
    non-ASCII / control characters or an added token."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 120)):
            r = rng.random()
            if r < 0.5:
                parts.append(rng.choice(words).upper() if rng.random() < 0.1 else rng.choice(words))
            elif r < 0.8:
                parts.append("".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(1, 25))))
            elif r < 0.97:
                parts.append("".join(rng.choices(_PLAIN, k=rng.randint(1, 8))))
            else:
                parts.append(rng.choice("xq") * rng.randint(97, 103))
        text = rng.choice([" ", "  ", "\t", "\n", "", " \r\n"]).join(parts)
        if rng.random() < odd:
            extra = rng.choice(["[MASK]", " [sep] ", "[CLS", *["".join(rng.choices(_ODD, k=3))] * 5])
            cut = rng.randint(0, len(text))
            text = text[:cut] + extra + text[cut:]
        out.append(text)
    return out


def _both(spec: dict, max_length: int) -> tuple:
    tokenizer = load_tokenizer(json.dumps(spec), max_length)
    rust = functools.partial(token_arrays, tokenizer)
    fast = fast_token_arrays(tokenizer, max_length, rust)
    assert fast is not None
    return rust, fast


def _assert_same(got: tuple, want: tuple) -> None:
    assert got[0].dtype == np.int32 and got[1].dtype == np.int64
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("max_length", [512, 64, 3])
def test_plain_and_mixed_texts_match_rust(spec, max_length):
    words = [w for w in spec["model"]["vocab"] if w.isascii()][1000:3000]
    rust, fast = _both(spec, max_length)
    plain = _random_texts(0, 600, words, odd=0.0)
    assert all(map(fast.covers, plain))  # the bulk path really runs
    _assert_same(fast(plain), rust(plain))
    mixed = _random_texts(1, 600, words, odd=0.5)
    plain_texts = sum(t.isascii() and fast.covers(t) for t in mixed)
    handed_over = sum(not fast.covers(t) for t in mixed)
    assert plain_texts > 200 and 20 < handed_over and len(mixed) - plain_texts - handed_over > 100  # all three routes
    _assert_same(fast(mixed), rust(mixed))
    for edge in ([""], ["", "a"], ["\u00e9"], ["[MASK]", "plain"], [" ".join(["word"] * 600)]):
        _assert_same(fast(edge), rust(edge))
    _assert_same(fast([]), rust([]))


@pytest.mark.parametrize("variant", ["cased", "no_post_processor", "bert_processing", "two_specials_after"])
def test_tokenizer_variants_match_rust(spec, variant):
    if variant == "cased":
        spec = {**spec, "normalizer": {**spec["normalizer"], "lowercase": False}}
    elif variant == "no_post_processor":  # the static query towers tokenize without special tokens
        spec = {**spec, "post_processor": None}
    elif variant == "bert_processing":
        spec = {**spec, "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}}
    else:
        post = spec["post_processor"]
        sep = {"SpecialToken": {"id": "[SEP]", "type_id": 0}}
        spec = {**spec, "post_processor": {**post, "single": [*post["single"], sep]}}
    words = [w for w in spec["model"]["vocab"] if w.isascii()][2000:4000]
    texts = _random_texts(2, 300, words, odd=0.2)
    for max_length in (128, 4):
        rust, fast = _both(spec, max_length)
        _assert_same(fast(texts), rust(texts))


def test_forgets_learned_words_and_stays_exact(spec):
    words = [w for w in spec["model"]["vocab"] if w.isascii()][5000:6000]
    rust, fast = _both(spec, 256)
    texts = _random_texts(3, 200, words, odd=0.0)
    assert fast.forgotten == 0 and fast.max_cached_words == wordpiece.MAX_CACHED_WORDS
    fast.max_cached_words = fast.known_words + 50
    for i in range(0, 200, 20):  # crosses the limit at every call
        _assert_same(fast(texts[i:i + 20]), rust(texts[i:i + 20]))
    assert fast.forgotten >= 5


def test_other_tokenizers_are_not_covered(spec):
    for other in ({**spec, "pre_tokenizer": {"type": "Whitespace"}}, {**spec, "normalizer": None},
                  {**spec, "model": {"type": "WordLevel", "vocab": spec["model"]["vocab"], "unk_token": "[UNK]"}},
                  {**spec, "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}):
        assert fast_token_arrays(load_tokenizer(json.dumps(other), 64), 64, lambda texts: None) is None
    assert fast_token_arrays(load_tokenizer(json.dumps(spec), 2), 2, lambda texts: None) is None  # no room for the text itself
