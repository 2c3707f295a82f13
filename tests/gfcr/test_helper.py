"""Calls under a time limit on a reused helper thread, their CPU charged to the caller."""

from __future__ import annotations

import threading
import time

from gfcr.procs.helper import call_with_timeout, charging


def _thread_of_call() -> int:
    seen = []
    assert call_with_timeout(lambda: seen.append(threading.get_ident()), 5.0) == "done"
    return seen[0]


def test_calls_reuse_one_helper_thread():
    first = _thread_of_call()
    assert first != threading.get_ident()
    assert all(_thread_of_call() == first for _ in range(20))


def test_a_call_past_its_limit_holds_its_helper_and_no_thread_is_leaked():
    release, ran = threading.Event(), []
    before = _thread_of_call()
    threads = threading.active_count()
    assert call_with_timeout(release.wait, 0.05) == "timeout"
    for _ in range(20):  # refused at once while the stuck call runs: no new thread
        assert call_with_timeout(lambda: ran.append(1), 5.0) == "busy"
    assert threading.active_count() == threads and ran == []
    release.set()
    deadline = time.monotonic() + 10
    while call_with_timeout(lambda: ran.append(1), 5.0) == "busy" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [1] and _thread_of_call() == before  # the same helper serves again


def test_an_error_that_escapes_the_call_keeps_the_helper():
    def boom():
        raise RuntimeError("scorer bug")

    before = _thread_of_call()
    assert call_with_timeout(boom, 5.0) == "done"
    assert _thread_of_call() == before


def test_helper_cpu_is_charged_to_the_caller():
    def spin():
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    with charging() as charged:
        mine = time.thread_time()
        assert call_with_timeout(spin, 5.0) == "done"
        mine = time.thread_time() - mine
    assert charged[0] >= 0.05 > mine  # the helper's CPU, not this thread's
    assert call_with_timeout(spin, 5.0) == "done" and charged[0] < 0.1  # outside: not charged
