"""``lsr.utils.env.env_seconds``: the one reader of seconds from environment variables (the collective timeout,
the heartbeat)."""

from __future__ import annotations

import pytest

from lsr.utils.env import env_seconds

NAME = "LSR_TEST_SECONDS"


@pytest.mark.parametrize(("raw", "off", "expected"), [
    (None, None, 7.0), ("", None, 7.0), ("  ", "the test", 7.0),   # unset or blank: the default
    ("2.5", None, 2.5), (" 30 ", "the test", 30.0), ("1e-3", None, 0.001),
    ("0", "the test", None), ("0.0", "the test", None),            # 0 turns off what can be turned off
])
def test_seconds_or_the_default_or_off(monkeypatch, raw, off, expected):
    if raw is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, raw)
    assert env_seconds(NAME, 7.0, off=off) == expected


@pytest.mark.parametrize(("raw", "off", "says"), [
    ("soon", None, "is not a positive number of seconds (unset it for the default 7)"),
    ("0", None, "is not a positive number of seconds"),
    ("-1", "the test", "is not a number of seconds (0 turns the test off; unset it for the default 7)"),
    ("inf", None, "is not a positive number of seconds"), ("nan", "the test", "is not a number of seconds"),
])
def test_anything_else_is_one_line_naming_the_variable_and_value(monkeypatch, raw, off, says):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError) as e:
        env_seconds(NAME, 7.0, off=off)
    assert str(e.value).startswith(f"{NAME}={raw!r} {says}") and "\n" not in str(e.value)
