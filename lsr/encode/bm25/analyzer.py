"""English text analysis matching Lucene's ``EnglishAnalyzer`` (what Anserini / Pyserini BM25 uses).

Chain: StandardTokenizer (UAX#29 word boundaries, approximated with one regular expression) ->
EnglishPossessiveFilter (drop a trailing ``'s``) -> LowerCaseFilter -> StopFilter (Lucene's 33 English
stopwords) -> PorterStemFilter. The stemmer is a port of Lucene's ``PorterStemmer``, which departs from
the published algorithm (and from snowball's ``porter``) in three places: words of one or two characters
are left alone ("as" stays "as"), ``-bli`` becomes ``-ble`` (not only ``-abli``), and ``-logi`` becomes
``-log``. Those matter on scientific text: "pathology" / "pathological" and "possibly" / "possible"
conflate only with them.

Known tokenizer approximations (all rare in English text): no emoji tokens, no Hebrew-letter or
Katakana-specific rules, letters above U+FFFF other than Han ideographs are breaks, tokens longer than
255 characters are not chopped, and the word-internal punctuation rules do not look through
combining marks.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

__all__ = ["ENGLISH_STOP_WORDS", "EnglishAnalyzer", "porter_stem", "tokenize"]

#: ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`` of Lucene.
ENGLISH_STOP_WORDS: frozenset[str] = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there"
    " these they this to was will with".split())

# ---------------------------------------------------------------------------------------- tokenizer
# UAX#29 word-break classes (Unicode WordBreakProperty.txt) for the word-internal punctuation rules:
# WB6/7 join letters across MidLetter / MidNumLet / Single_Quote ("don't", "e.g", "a:b");
# WB11/12 join digits across MidNum / MidNumLet / Single_Quote ("3.14", "10,000").
_MID_LETTER = ":\u00b7\u0387\u05f4\u2027\ufe13\ufe55\uff1a"
_MID_NUM_LET = ".\u2018\u2019\u2024\ufe52\uff07\uff0e'"  # Single_Quote "'" folded in: same rules
_MID_NUM = ",;\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54\uff0c\uff1b"
# Lucene emits every Han ideograph and every Hiragana character as a token of its own.
_SINGLE = "\u3040-\u309f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_POSSESSIVE = ("'s", "\u2019s", "\uff07s")  # EnglishPossessiveFilter; text is already lowercased


def _ranges(codepoints: list[int]) -> str:
    """A regex character-class body matching exactly the given (ascending) code points."""
    out, i = [], 0
    while i < len(codepoints):
        j = i
        while j + 1 < len(codepoints) and codepoints[j + 1] == codepoints[j] + 1:
            j += 1
        lo, hi = re.escape(chr(codepoints[i])), re.escape(chr(codepoints[j]))
        out.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return "".join(out)


@lru_cache(maxsize=1)
def _token_re() -> re.Pattern[str]:
    """Compiled once on first use (~30 ms).

    Word characters are one positive class of Basic Multilingual Plane code points, which ``re``
    compiles to a bitmap; per-character alternations, or ranges above U+FFFF (tested one by one),
    make tokenization 5-10x slower. Supplementary-plane letters other than Han are rare enough to
    be treated as breaks.
    """
    single = re.compile(f"[{_SINGLE}]")
    word, extend = [], []
    for cp in range(0x10000):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        # Extend / Format characters attach to the character before them (WB4); ZWSP is a break.
        is_extend = cat in ("Mn", "Mc", "Me") or (cat == "Cf" and ch != "\u200b")
        if is_extend:
            extend.append(cp)
        # Python's \w also matches "No" (superscripts, fractions), which UAX#29 does not join.
        if is_extend or ((ch.isalnum() or ch == "_") and cat != "No" and not single.match(ch)):
            word.append(cp)
    w, x = _ranges(word), _ranges(extend)
    letter = "[^\\W\\d_]"
    mid = (f"(?:(?<={letter})[{re.escape(_MID_LETTER + _MID_NUM_LET)}](?={letter})"
           f"|(?<=\\d)[{re.escape(_MID_NUM + _MID_NUM_LET)}](?=\\d))")
    return re.compile(f"[{_SINGLE}][{x}]*|[{w}]+(?:{mid}[{w}]+)*")


def tokenize(text: str) -> list[str]:
    """Lowercased StandardTokenizer-like tokens: "COVID-19 patients' IL-6" -> ["covid", "19", "patients", "il", "6"]."""
    return _token_re().findall(text.lower())


# ---------------------------------------------------------------------------------------- stemmer
class _LucenePorter:
    """Port of ``org.apache.lucene.analysis.en.PorterStemmer`` on a Python string.

    ``b`` always holds the word up to the Java ``k`` (so k == len(b) - 1) and ``j`` is the Java ``j``:
    the end of the stem in front of the suffix last matched by ``ends``.
    """

    __slots__ = ("b", "j")

    def __init__(self, word: str) -> None:
        self.b = word
        self.j = 0

    def cons(self, i: int) -> bool:
        ch = self.b[i]
        if ch in "aeiou":
            return False
        if ch == "y":
            return i == 0 or not self.cons(i - 1)
        return True  # any other character, digits and punctuation included, counts as a consonant

    def m(self) -> int:
        """Number of vowel-consonant sequences in b[0..j]."""
        n, i, j = 0, 0, self.j
        while i <= j and self.cons(i):
            i += 1
        while True:
            while i <= j and not self.cons(i):
                i += 1
            if i > j:
                return n
            n += 1
            while i <= j and self.cons(i):
                i += 1
            if i > j:
                return n

    def vowel_in_stem(self) -> bool:
        return any(not self.cons(i) for i in range(self.j + 1))

    def doublec(self, j: int) -> bool:
        return j >= 1 and self.b[j] == self.b[j - 1] and self.cons(j)

    def cvc(self, i: int) -> bool:
        return (i >= 2 and self.cons(i) and not self.cons(i - 1) and self.cons(i - 2)
                and self.b[i] not in "wxy")

    def ends(self, s: str) -> bool:
        if self.b.endswith(s):
            self.j = len(self.b) - len(s) - 1
            return True
        return False

    def setto(self, s: str) -> None:
        self.b = self.b[: self.j + 1] + s

    def r(self, s: str) -> None:
        if self.m() > 0:
            self.setto(s)

    def step1(self) -> None:  # plurals, -ed, -ing
        b = self.b
        if b[-1] == "s":
            if self.ends("sses"):
                self.b = b[:-2]
            elif self.ends("ies"):
                self.setto("i")
            elif b[-2] != "s":
                self.b = b[:-1]
        if self.ends("eed"):
            if self.m() > 0:
                self.b = self.b[:-1]
        elif (self.ends("ed") or self.ends("ing")) and self.vowel_in_stem():
            self.b = self.b[: self.j + 1]
            if self.ends("at"):
                self.setto("ate")
            elif self.ends("bl"):
                self.setto("ble")
            elif self.ends("iz"):
                self.setto("ize")
            elif self.doublec(len(self.b) - 1):
                if self.b[-1] not in "lsz":
                    self.b = self.b[:-1]
            elif self.m() == 1 and self.cvc(len(self.b) - 1):
                self.setto("e")

    def step2(self) -> None:  # terminal y -> i
        if self.ends("y") and self.vowel_in_stem():
            self.b = self.b[:-1] + "i"

    def replace_first(self, table: tuple[tuple[str, str], ...]) -> None:
        """Steps 3 and 4: the first suffix of ``table`` that matches is replaced when m() > 0."""
        for suffix, repl in table:
            if self.ends(suffix):
                self.r(repl)
                return

    def step5(self) -> None:  # -ant, -ence, ... in context <c>vcvc<v>
        for suffix in _STEP5.get(self.b[-2], ()):
            if self.ends(suffix):
                if suffix == "ion" and (self.j < 0 or self.b[self.j] not in "st"):
                    continue
                if self.m() > 1:
                    self.b = self.b[: self.j + 1]
                return

    def step6(self) -> None:  # final -e, -ll
        self.j = len(self.b) - 1
        if self.b[-1] == "e":
            a = self.m()
            if a > 1 or (a == 1 and not self.cvc(len(self.b) - 2)):
                self.b = self.b[:-1]
        # Java keeps j at the old end here; a removed final vowel does not change m(), so this is equal.
        self.j = len(self.b) - 1
        if self.b[-1] == "l" and self.doublec(len(self.b) - 1) and self.m() > 1:
            self.b = self.b[:-1]

    def stem(self) -> str:
        if len(self.b) <= 2:  # Lucene leaves words of one or two characters alone
            return self.b
        self.step1()
        self.step2()
        if len(self.b) > 1:
            self.replace_first(_STEP3.get(self.b[-2], ()))
        self.replace_first(_STEP4.get(self.b[-1], ()))
        if len(self.b) > 1:
            self.step5()
        self.step6()
        return self.b


# Suffix tables keyed by the character Lucene switches on (penultimate for steps 3 and 5, last for 4).
_STEP3 = {
    "a": (("ational", "ate"), ("tional", "tion")),
    "c": (("enci", "ence"), ("anci", "ance")),
    "e": (("izer", "ize"),),
    "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
    "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
    "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
    "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
    "g": (("logi", "log"),),
}
_STEP4 = {
    "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
    "i": (("iciti", "ic"),),
    "l": (("ical", "ic"), ("ful", "")),
    "s": (("ness", ""),),
}
_STEP5 = {
    "a": ("al",), "c": ("ance", "ence"), "e": ("er",), "i": ("ic",), "l": ("able", "ible"),
    "n": ("ant", "ement", "ment", "ent"), "o": ("ion", "ou"), "s": ("ism",), "t": ("ate", "iti"),
    "u": ("ous",), "v": ("ive",), "z": ("ize",),
}


@lru_cache(maxsize=1 << 20)  # shared by every analyzer in the process
def porter_stem(word: str) -> str:
    """Stem a lowercased word exactly as Lucene's ``PorterStemFilter`` does ("running" -> "run")."""
    return _LucenePorter(word).stem()


# ---------------------------------------------------------------------------------------- analyzer
class EnglishAnalyzer:
    """Text -> list of index terms, like Lucene's ``EnglishAnalyzer`` (no stem-exclusion set).

    Args:
        stopwords: words dropped after lowercasing and possessive removal (default: Lucene's 33).
        stemmer: "porter" (Lucene's Porter stemmer), "snowball:<language>" (a snowballstemmer
            algorithm, e.g. "snowball:english" for Porter2), or None for no stemming.
        cache_size: distinct raw tokens whose analysis is memoised (the cache is cleared when full).
    """

    name = "lucene-english"
    version = 1

    def __init__(self, stopwords: Iterable[str] | None = None, stemmer: str | None = "porter",
                 cache_size: int = 1 << 21) -> None:
        self.stopwords = ENGLISH_STOP_WORDS if stopwords is None else frozenset(stopwords)
        self.stemmer = stemmer
        if stemmer == "porter":
            self._stem = porter_stem
        elif stemmer is None:
            self._stem = str
        elif stemmer.startswith("snowball:"):
            import snowballstemmer  # optional path only

            self._stem = snowballstemmer.stemmer(stemmer.split(":", 1)[1]).stemWord
        else:
            raise ValueError(f"unknown stemmer {stemmer!r} (use 'porter', 'snowball:<language>' or None)")
        self.cache_size = cache_size
        self._cache: dict[str, str] = {}

    def _term(self, token: str) -> str:
        """Analysis of one raw lowercased token; "" when it produces no term."""
        if token.endswith(_POSSESSIVE):
            token = token[:-2]
        # a run of underscores is a UAX#29 segment but not a Lucene token
        if token in self.stopwords or not token.strip("_"):
            return ""
        return self._stem(token)

    def __call__(self, text: str) -> list[str]:
        """The index terms of ``text``, in order (repeats kept)."""
        cache = self._cache
        tokens = tokenize(text)
        missing = set(tokens).difference(cache)
        if missing:
            if len(cache) + len(missing) > self.cache_size:
                cache.clear()
                missing = set(tokens)
            for t in missing:
                cache[t] = self._term(t)
        return list(filter(None, map(cache.__getitem__, tokens)))  # "" marks a dropped token

    def describe(self) -> dict[str, Any]:
        """JSON description; two analyzers with equal descriptions produce the same terms."""
        default_stop = self.stopwords == ENGLISH_STOP_WORDS
        return {"name": self.name, "version": self.version, "stemmer": self.stemmer,
                "stopwords": "lucene-english" if default_stop else sorted(self.stopwords)}

    @classmethod
    def from_description(cls, desc: dict[str, Any]) -> EnglishAnalyzer:
        """Rebuild an analyzer from :meth:`describe` output (checks name and version)."""
        if desc.get("name") != cls.name or desc.get("version") != cls.version:
            raise ValueError(f"analyzer {desc.get('name')!r} v{desc.get('version')} is not supported by this"
                             f" version of lsr ({cls.name!r} v{cls.version})")
        stop = desc.get("stopwords", "lucene-english")
        return cls(stopwords=None if stop == "lucene-english" else stop, stemmer=desc.get("stemmer", "porter"))
