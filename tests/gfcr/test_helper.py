"""Calls under a time limit on a reused helper thread, their CPU charged to the caller."""

from __future__ import annotations

import threading
import time

from gfcr.helper import call_with_timeout, charging


def _thread_of_call() -> int:
    seen = []
    assert call_with_timeout(lambda: seen.append(threading.get_ident()), 5.0)
    return seen[0]


def test_calls_reuse_one_helper_thread():
    first = _thread_of_call()
    assert first != threading.get_ident()
    assert all(_thread_of_call() == first for _ in range(20))


def test_a_call_past_its_limit_is_left_and_the_next_gets_a_new_helper():
    release = threading.Event()
    before = _thread_of_call()
    assert call_with_timeout(release.wait, 0.05) is False
    after = _thread_of_call()  # served while the stuck call still waits
    release.set()
    assert after != before


def test_an_error_that_escapes_the_call_keeps_the_helper():
    def boom():
        raise RuntimeError("scorer bug")

    before = _thread_of_call()
    assert call_with_timeout(boom, 5.0) is True
    assert _thread_of_call() == before


def test_helper_cpu_is_charged_to_the_caller():
    def spin():
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    with charging() as charged:
        mine = time.thread_time()
        assert call_with_timeout(spin, 5.0)
        mine = time.thread_time() - mine
    assert charged[0] >= 0.05 > mine  # the helper's CPU, not this thread's
    assert call_with_timeout(spin, 5.0) and charged[0] < 0.1  # outside: not charged
