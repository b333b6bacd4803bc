"""Filter expressions (lsr.index.filter_expr): every operator against a numpy reference with SQL's three-valued
logic on random tables with nulls, the normalised text, exact int / float and date comparisons, and the one-line
refusals of text the language does not accept."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lsr.index.filter_expr import parse_filter

LANGS = np.array(["en", "de", "fr", "zh-cn", ""])


def _table(n: int, seed: int) -> tuple[pa.Table, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A random table with nulls in every column, and its columns as numpy (values, valid) pairs."""
    rng = np.random.default_rng(seed)
    cols = {"year": rng.integers(1995, 2025, n), "score": np.round(rng.normal(0, 2, n), 2),
            "lang": LANGS[rng.integers(0, len(LANGS), n)], "open": rng.random(n) < 0.5,
            "my-col": rng.integers(-3, 4, n), "month": rng.integers(1, 13, n)}
    ref = {k: (v, rng.random(n) > 0.15) for k, v in cols.items()}
    table = pa.table({k: pa.array(v, mask=~ok) for k, (v, ok) in ref.items()})
    return table, ref


# three-valued logic on (true, known) masks: a row is in the result when its value is known and true
def _cmp(ref, name, fn):
    v, ok = ref[name]
    return fn(v) & ok, ok.copy()


def _and(a, b):
    return a[0] & b[0], (a[1] & b[1]) | (a[1] & ~a[0]) | (b[1] & ~b[0])


def _or(a, b):
    return a[0] | b[0], (a[1] & b[1]) | a[0] | b[0]


def _not(a):
    return a[1] & ~a[0], a[1]


CASES = {
    "year == 2010": lambda r: _cmp(r, "year", lambda v: v == 2010),
    "year != 2010": lambda r: _cmp(r, "year", lambda v: v != 2010),
    "year < 2005": lambda r: _cmp(r, "year", lambda v: v < 2005),
    "year <= 2005": lambda r: _cmp(r, "year", lambda v: v <= 2005),
    "year > 2019": lambda r: _cmp(r, "year", lambda v: v > 2019),
    "year >= 2019": lambda r: _cmp(r, "year", lambda v: v >= 2019),
    "2010 <= year < 2020": lambda r: _and(_cmp(r, "year", lambda v: v >= 2010), _cmp(r, "year", lambda v: v < 2020)),
    "2000 < year": lambda r: _cmp(r, "year", lambda v: v > 2000),
    "year > 2010.5": lambda r: _cmp(r, "year", lambda v: v > 2010.5),
    "year <= 2010.5": lambda r: _cmp(r, "year", lambda v: v <= 2010.5),
    "year == 2010.5": lambda r: _cmp(r, "year", lambda v: v == 2010.5),
    "score >= -1.5": lambda r: _cmp(r, "score", lambda v: v >= -1.5),
    "score < 0": lambda r: _cmp(r, "score", lambda v: v < 0),
    "lang == 'en'": lambda r: _cmp(r, "lang", lambda v: v == "en"),
    "lang != ''": lambda r: _cmp(r, "lang", lambda v: v != ""),
    "lang < 'f'": lambda r: _cmp(r, "lang", lambda v: v < "f"),
    "lang in ['en', 'de']": lambda r: _cmp(r, "lang", lambda v: np.isin(v, ["en", "de"])),
    "lang not in ('en', 'zh-cn')": lambda r: _cmp(r, "lang", lambda v: ~np.isin(v, ["en", "zh-cn"])),
    "year in [2001, 2002.0, 2003.5]": lambda r: _cmp(r, "year", lambda v: np.isin(v, [2001, 2002])),
    "lang in ['en', None]": lambda r: (_cmp(r, "lang", lambda v: v == "en")[0] | ~r["lang"][1],
                                       np.ones(len(r["lang"][1]), bool)),
    "year is None": lambda r: (~r["year"][1], np.ones(len(r["year"][1]), bool)),
    "year is not None": lambda r: (r["year"][1].copy(), np.ones(len(r["year"][1]), bool)),
    "open": lambda r: _cmp(r, "open", lambda v: v),
    "not open": lambda r: _not(_cmp(r, "open", lambda v: v)),
    "open == False": lambda r: _cmp(r, "open", lambda v: ~v),
    "not (year > 2010)": lambda r: _not(_cmp(r, "year", lambda v: v > 2010)),
    "col('my-col') > 0": lambda r: _cmp(r, "my-col", lambda v: v > 0),
    "year > 2010 and lang == 'en'": lambda r: _and(_cmp(r, "year", lambda v: v > 2010),
                                                   _cmp(r, "lang", lambda v: v == "en")),
    "year > 2010 or lang == 'en'": lambda r: _or(_cmp(r, "year", lambda v: v > 2010),
                                                 _cmp(r, "lang", lambda v: v == "en")),
    "not (year < 2000 or not open) and score > 0": lambda r: _and(
        _not(_or(_cmp(r, "year", lambda v: v < 2000), _not(_cmp(r, "open", lambda v: v)))),
        _cmp(r, "score", lambda v: v > 0)),
    "month < score": lambda r: _and(_cmp(r, "month", lambda v: np.ones(len(v), bool)),
                                    _cmp(r, "score", lambda v: r["month"][0] < v)),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("text", list(CASES))
def test_every_operator_matches_the_numpy_reference(text, seed):
    table, ref = _table(400, seed)
    got = parse_filter(text).evaluate(table)
    want = CASES[text](ref)[0]
    assert got.dtype == bool and got.shape == (400,)
    np.testing.assert_array_equal(got, want)
    assert 0 < got.sum() < 400 or text in ("year == 2010.5",)   # the cases select something, never everything


@pytest.mark.parametrize("text", list(CASES))
def test_the_normalised_text_parses_to_the_same_filter(text):
    table, _ = _table(200, 5)
    e = parse_filter(text)
    again = parse_filter(str(e))
    assert again == e and str(again) == str(e)
    np.testing.assert_array_equal(again.evaluate(table), e.evaluate(table))


def test_normalised_text_and_columns():
    e = parse_filter("2010<=year<2020 and (lang in ('en','de') or not open)")
    assert str(e) == "2010 <= year and year < 2020 and (lang in ['en', 'de'] or not open)"
    assert e.columns() == {"year", "lang", "open"}
    assert str(parse_filter("not(year>3)")) == "not (year > 3)"
    assert str(parse_filter("col('my-col') == 1 and col('class') != col('in')")) == \
        "col('my-col') == 1 and col('class') != col('in')"


def test_nulls_are_unknown_and_an_unknown_row_is_excluded():
    t = pa.table({"year": pa.array([1, None, 5]), "lang": pa.array(["en", None, "de"])})
    run = lambda text: parse_filter(text).evaluate(t).tolist()  # noqa: E731
    assert run("year > 3") == [False, False, True]
    assert run("not (year > 3)") == [True, False, False]    # not unknown is unknown: excluded
    assert run("year != 5") == [True, False, False]
    assert run("year != 5 or year is None") == [True, True, False]
    assert run("year > 3 or lang is None") == [False, True, True]   # True or unknown is True
    assert run("not (year > 3 and lang == 'xx')") == [True, False, True]   # False and unknown is False
    assert run("lang not in ['en', None]") == [False, False, True]


def test_int_columns_against_floats_are_exact_above_2_to_the_53():
    big = 2 ** 60
    t = pa.table({"n": pa.array([big, big + 1, big + 2], pa.int64())})
    assert parse_filter(f"n > {big}").evaluate(t).tolist() == [False, True, True]
    assert parse_filter(f"n in [{big + 1}]").evaluate(t).tolist() == [False, True, False]
    assert parse_filter("n > 2.5").evaluate(pa.table({"n": [2, 3]})).tolist() == [False, True]
    assert parse_filter("n >= 2.5").evaluate(pa.table({"n": [2, 3]})).tolist() == [False, True]
    assert parse_filter("n <= -2.5").evaluate(pa.table({"n": [-3, -2]})).tolist() == [True, False]


def test_float32_dates_dictionaries_and_null_columns():
    t = pa.table({"s": pa.array([0.1, 0.2], pa.float32()),
                  "d": pa.array(["2020-01-01", "2021-06-01"]).cast(pa.timestamp("s")),
                  "day": pa.array(["2020-01-01", "2021-06-01"]).cast(pa.timestamp("s")).cast(pa.date32()),
                  "cat": pa.array(["a", "b"]).dictionary_encode(), "none": pa.nulls(2)})
    assert parse_filter("s == 0.1").evaluate(t).tolist() == [True, False]   # the literal as the column stores it
    assert parse_filter("d >= '2021-01-01'").evaluate(t).tolist() == [False, True]
    assert parse_filter("day in ['2020-01-01']").evaluate(t).tolist() == [True, False]
    assert parse_filter("cat == 'b' or cat in ['a']").evaluate(t).tolist() == [True, True]
    assert parse_filter("none == 3").evaluate(t).tolist() == [False, False]
    assert parse_filter("none is None").evaluate(t).tolist() == [True, True]
    assert parse_filter("year > 1").evaluate(pa.table({"year": pa.array([], pa.int64())})).shape == (0,)


@pytest.mark.parametrize("text, message", [
    ("year >> 3", "filter 'year >> 3': operator >> is not supported (use == != < <= > >= in, not in"),
    ("year + 1 > 3", "operator + is not supported"),
    ("__import__('os').system('true')", "is not supported"),
    ("open('x') == 1", "the one call is col"),
    ("year.real > 1", "year.real is not supported"),
    ("year >", "not a valid expression"),
    ("", "empty"),
    ("year == None", "write 'is None'"),
    ("1 < 2", "compares two constants"),
    ("3", "is not a condition"),
    ("year in 2010", "in takes a list of literals"),
    ("year in [x]", "x is not supported"),
    ("2010 in year", "left side of in must be a column"),
    ("year is 3", "only test a column against None"),
    ("year > 1e999", "not a finite number"),
    (f"year > {2 ** 64}", "outside the signed 64-bit range"),
    ("year > b'x'", "is not a literal a filter takes"),
    ("lambda: 1", "is not supported"),
    ("[y for y in year]", "is not supported"),
    ("not " * 300 + "open", "nested"),
])
def test_text_the_language_does_not_take_is_one_line(text, message):
    with pytest.raises(ValueError, match="^filter ") as e:
        parse_filter(text)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("foo == 1", "no column 'foo'; the metadata columns are: year, score, lang, open, my-col, month"),
    ("lang > 3", "column 'lang' holds strings and 3 is a number"),
    ("year > 3 and lang > 3", "lang > 3: column 'lang' holds strings"),
    ("open == 1", "column 'open' holds booleans and 1 is a number"),
    ("year == 'x'", "column 'year' holds numbers and 'x' is a string"),
    ("lang == year", "column 'lang' holds strings and column 'year' holds numbers"),
    ("year", "holds numbers, not booleans"),
    ("lang in ['en', 1]", "1 is a number"),
])
def test_unknown_columns_and_type_mismatches_are_one_line(text, message):
    table, _ = _table(10, 0)
    e = parse_filter(text)
    with pytest.raises(ValueError, match="^filter ") as err:
        e.evaluate(table)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="^filter "):
        e.check(table.schema)   # the same refusal without computing


def test_a_bad_date_literal_is_one_line():
    t = pa.table({"d": pa.array(["2020-01-01"]).cast(pa.timestamp("s"))})
    with pytest.raises(ValueError, match="'2020-13-45' is not a date / time"):
        parse_filter("d < '2020-13-45'").evaluate(t)
