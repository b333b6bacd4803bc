"""stream.Pipeline: its first stage runs ahead of the second, results come in order, errors reach the consumer,
close() stops both threads; TokenizerPool.submit lets several text lists be in flight at once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lsr.encode.stream import Pipeline


def test_start_runs_ahead_of_finish_and_order_is_kept():
    events, lock = [], threading.Lock()

    def start(i: int) -> int:
        with lock:
            events.append(("start", i))
        return i * 10

    def finish(x: int) -> int:
        time.sleep(0.02)
        with lock:
            events.append(("finish", x // 10))
        return x + 1

    pipe = Pipeline(iter(range(6)), start, finish, depth=2)
    try:
        assert list(pipe) == [1, 11, 21, 31, 41, 51]
    finally:
        pipe.close()
    # item 1 was started before item 0 was finished: the first stage did not wait for the second
    assert events.index(("start", 1)) < events.index(("finish", 0))


@pytest.mark.parametrize("where", ["items", "start", "finish"])
def test_errors_reach_the_consumer(where):
    def items():
        yield 1
        if where == "items":
            raise KeyError("from items")
        yield 2

    def start(x: int) -> int:
        if where == "start" and x == 2:
            raise KeyError("from start")
        return x

    def finish(x: int) -> int:
        if where == "finish" and x == 2:
            raise KeyError("from finish")
        return x

    pipe = Pipeline(items(), start, finish, depth=2)
    got = []
    with pytest.raises(KeyError, match=f"from {where}"):
        for x in pipe:
            got.append(x)
    pipe.close()
    assert got == [1]


def test_close_stops_both_threads_midway():
    pipe = Pipeline(iter(range(1000)), lambda x: x, lambda x: x, depth=2)
    for x in pipe:
        if x == 3:
            break
    pipe.close()
    assert not pipe._started._thread.is_alive() and not pipe._finished._thread.is_alive()


def test_pool_submissions_overlap(data_dir):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from lsr.encode.splade.checkpoint import TextTokenizer

    tok = TextTokenizer(AutoTokenizer.from_pretrained(data_dir / "bert-base-uncased"), 32)
    a = [f"first list, text {i}" for i in range(50)]
    b = [f"second list: {i} " * (i % 7) for i in range(70)]
    with tok.pool(2) as pool:
        finish_a, finish_b, finish_empty = pool.submit(a), pool.submit(b), pool.submit([])
        for finish, texts, local in ((finish_b, b, tok), (finish_a, a, None)):  # finished in any order
            for got, want in zip(finish(local), tok(texts)):
                np.testing.assert_array_equal(got, want)
        assert [x.size for x in finish_empty()] == [0, 0]
