"""The bulk ASCII WordPiece path gives exactly the Rust tokenizer's ids: on plain text, on text it must hand
to Rust (non-ASCII, control characters, added tokens), mixed in one call, for tokenizer variants and
truncation lengths, and after forgetting its learned words."""

from __future__ import annotations

import functools
import json
import random
import string

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from lsr.encode import wordpiece
from lsr.encode.tokenize_pool import load_tokenizer, token_arrays
from lsr.encode.wordpiece import fast_token_arrays

_PLAIN = string.printable.replace("\x0b", "").replace("\x0c", "")  # printable ASCII without the two control chars
_ODD = "\x00\x01\x0b\x0c\x1f\x7f\u00e9\u00dc\u4e2d\u00a0\u2028\ufffd"


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
            extra = rng.choice(["[MASK]", " [sep] ", "[CLS", "".join(rng.choices(_ODD, k=3))])
            cut = rng.randint(0, len(text))
            text = text[:cut] + extra + text[cut:]
        out.append(text)
    return out


def _both(spec: dict, max_length: int) -> tuple:
    text = json.dumps(spec)
    rust = functools.partial(token_arrays, load_tokenizer(text, max_length))
    fast = fast_token_arrays(text, max_length, rust)
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
    mixed = _random_texts(1, 600, words, odd=0.3)
    handed_over = sum(not fast.covers(t) for t in mixed)
    assert 100 < handed_over < 300
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


def test_forgets_learned_words_and_stays_exact(spec, monkeypatch):
    words = [w for w in spec["model"]["vocab"] if w.isascii()][5000:6000]
    rust, fast = _both(spec, 256)
    texts = _random_texts(3, 200, words, odd=0.0)
    monkeypatch.setattr(wordpiece, "MAX_CACHED_WORDS", len(fast._words) + 50)
    resets = []
    reset = fast._reset
    monkeypatch.setattr(fast, "_reset", lambda: (resets.append(1), reset()))
    for i in range(0, 200, 20):  # crosses the limit at every call
        _assert_same(fast(texts[i:i + 20]), rust(texts[i:i + 20]))
    assert len(resets) >= 5


def test_other_tokenizers_are_not_covered(spec):
    for other in ({**spec, "pre_tokenizer": {"type": "Whitespace"}}, {**spec, "normalizer": None},
                  {**spec, "model": {**spec["model"], "type": "BPE"}},
                  {**spec, "post_processor": {"type": "RobertaProcessing"}}):
        assert fast_token_arrays(json.dumps(other), 64, lambda texts: None) is None
    assert fast_token_arrays(json.dumps(spec), 2, lambda texts: None) is None  # no room for the text itself
