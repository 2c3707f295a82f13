"""Code verdicts are the harness's (issue 26, item 3): every test form a dataset uses is
judged outside the sandbox or refused with the reason; plain answers that are not
literals score; a program that crashes or hits a limit is wrong (reward 0, the reason
kept), never dropped; only a fault of the harness is a scorer failure."""

from __future__ import annotations

import json

import pytest

from gfcr.core.rollout import col
from stages import CodeTests, Sandbox, Verify
from stages.sandbox import unavailable
from stages.filter.verifiers import Wrong
from tests.resources.rollouts import context, rollouts
from tests.resources.sandbox_users import require

FAST = Sandbox(cpu_seconds=1, wall_seconds=5.0, memory_mb=256)
YES = ("class Yes:\n    def __eq__(self, other):\n        return True\n"
       "    __ne__ = __lt__ = __gt__ = __eq__\n    __hash__ = object.__hash__\n"
       "    def __sub__(self, other):\n        return 0\n    __abs__ = lambda self: 0\n")
FORGED = YES + "def square(x):\n    return 0 if x == 0 else Yes()"
HONEST = "def square(x):\n    return x * x"
TOP = "assert square(0) == 0\n"  # the one the forger answers honestly
FORMS = {
    "an assert in a loop": "for x, y in [(2, 4), (3, 9)]:\n    assert square(x) == y",
    "an assert under an if": "if 3 > 2:\n    assert square(3) == 9",
    "HumanEval's check function": (
        "def check(candidate):\n    assert candidate(3) == 9\n"
        "    assert abs(candidate(-2) - 4) < 1e-6\ncheck(square)"),
    "a pytest-style test function": "def test_square():\n    assert square(4) == 16",
    "a comprehension judging the program's values": (
        "assert all(v >= 4 for v in [square(2), square(-3)])"),
    "an assert in a loop over a dict of cases": (
        "cases = {2: 4, 3: 9}\nfor x in sorted(cases):\n    assert square(x) == cases[x]"),
}


@pytest.fixture(scope="module")
def score():
    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    return CodeTests(sandbox=FAST).scorer(context())


def _meta(tests: str) -> str:
    return json.dumps({"tests": tests})


@pytest.mark.parametrize("form", FORMS)
def test_an_always_equal_object_scores_nothing_in_any_test_form(score, form):
    tests = _meta(TOP + FORMS[form])
    assert score(FORGED, None, tests) == 0.0
    assert score(HONEST, None, tests) == 1.0  # the control: the form is judged, not refused


def test_an_always_equal_object_in_a_try_block_is_refused_with_the_reason(score):
    tests = _meta(TOP + "try:\n    assert square(3) == 9\nexcept ZeroDivisionError:\n    pass")
    with pytest.raises(ValueError, match="is a try block the harness cannot judge"):
        score(FORGED, None, tests)


def test_a_try_block_expecting_an_exception_is_judged_outside(score):
    tests = _meta("assert root(4) == 2\n"
                  "try:\n    root(-1)\n    assert False\nexcept ValueError:\n    pass")
    good = "def root(x):\n    if x < 0:\n        raise ValueError(x)\n    return int(x ** 0.5)"
    assert score(good, None, tests) == 1.0
    assert score("def root(x):\n    return int(abs(x) ** 0.5)", None, tests) == 0.0
    assert score("def root(x):\n    return 1 // 0 if x < 0 else 2", None, tests) == 0.0


ANSWERS = [("frozenset({1, 2})", "{1, 2}"), ("Fraction(1, 2)", "0.5"),
           ("Point(1, 2)", "(1, 2)"), ("Fraction(1, 3)", "Fraction(1, 3)"),
           ("{'a': [1, (2, 3)], 'b': {4}}", "{'a': [1, (2, 3)], 'b': {4}}"),
           ("Decimal('1.5')", "1.5"), ("b'ab' + bytes(1)", "b'ab\\x00'")]


def test_a_correct_answer_that_is_not_a_literal_scores(score):
    code = ("from fractions import Fraction\nfrom decimal import Decimal\n"
            "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\n"
            f"def f(i):\n    return [{', '.join(a for a, _ in ANSWERS)}][i]")
    tests = _meta("from fractions import Fraction\n" + "\n".join(
        f"assert f({i}) == {expected}" for i, (_, expected) in enumerate(ANSWERS)))
    assert score(code, None, tests) == 1.0
    assert score(code.replace("[i]", "[i - 1]"), None, tests) == 0.0  # the control


def test_mbpp_and_humaneval_styles_score_as_python_says(score):
    tests = _meta("import math\nassert math.isclose(area(2), 12.566, rel_tol=0.001)\n"
                  "assert set(evens([1, 2, 4])) == set([2, 4])\n"
                  "assert list(evens([3, 6])) == [6]\nassert evens([])  == []\n"
                  "assert is_even(4)\nassert not is_even(3)\nassert is_even(8) is True")
    code = ("import math\ndef area(r):\n    return math.pi * r * r\n"
            "def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n"
            "def is_even(x):\n    return x % 2 == 0")
    assert score(code, None, tests) == 1.0
    assert score(code.replace("return x % 2 == 0", "return True"), None, tests) == 0.0


def test_a_crash_a_limit_or_a_loop_is_wrong_with_its_reason_never_dropped():
    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    tests = json.dumps({"tests": ["assert f() == 1"]})
    table = rollouts(["g"] * 5, completion=[
        "def f():\n    return 1",                                         # right
        "def f():\n    while True: pass\nf()",                            # loops
        "import sys\nprint('MemoryError', file=sys.stderr)\nsys.exit(1)",  # 'hits' a limit
        "raise RuntimeError('boom')",                                     # crashes
        "def f():\n    return 2"],                                        # wrong
        meta=[tests] * 5, answer=[None] * 5)
    result = Verify(scorer=CodeTests(sandbox=FAST.model_copy(update={"wall_seconds": 8.0})),
                    timeout=20.0, on_error="drop").apply(context(), table)
    assert result.keep == [True] * 5  # none dropped, although on_error="drop"
    assert result.table.column(col.REWARD).to_pylist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    errors = result.table.column(col.SCORE_ERROR).to_pylist()
    assert errors[0] is None and errors[4] is None
    assert "cpu_time" in errors[1] and "memory" in errors[2], errors
    assert "crashed" in errors[3] and "RuntimeError: boom" in errors[3], errors


def test_code_too_large_or_not_text_is_a_verdict_not_a_scorer_failure():
    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    tests = json.dumps({"tests": ["assert f() == 1"]})
    huge = "def f():\n    return 1\n" + "#" * (16 << 20)
    table = rollouts(["g"] * 2, completion=[huge, "def f():\n    return 1"],
                     meta=[tests] * 2, answer=[None] * 2)
    result = Verify(scorer=CodeTests(sandbox=FAST), timeout=20.0).apply(context(), table)
    assert result.keep == [True, True]
    assert result.table.column(col.REWARD).to_pylist() == [0.0, 1.0]
    errors = result.table.column(col.SCORE_ERROR).to_pylist()
    assert "over the sandbox's file_mb=8" in errors[0], errors
    # Arrow holds no lone surrogate; a scorer called on one (a JSON escape decoded) gives
    # the same kind of verdict, which Verify keeps as above
    with pytest.raises(Wrong, match="lone surrogate at character 21"):
        CodeTests(sandbox=FAST).scorer(context())("def f():\n    return '\ud800'", None,
                                                  tests)


def test_inputs_a_test_draws_at_random_are_drawn_outside_with_their_answers(score):
    """HumanEval/53's style: ``x, y = random.randint(...)`` then ``== x + y``. The judge
    draws the inputs from its own generator and sends only them in; a tuple class the
    tests define exists on both sides."""
    tests = _meta("import random\nfrom collections import namedtuple\n"
                  "P = namedtuple('P', 'x y')\n"
                  "def check(candidate):\n    for _ in range(20):\n"
                  "        x, y = random.randint(0, 1000), random.randint(0, 1000)\n"
                  "        assert candidate(x, y) == x + y\n"
                  "        assert swap(P(x, y)) == P(y, x)\ncheck(add)")
    code = "def add(x, y):\n    return x + y\ndef swap(p):\n    return (p[1], p[0])"
    assert score(code, None, tests) == 1.0
    assert score(code.replace("(p[1], p[0])", "p"), None, tests) == 0.0
    assert score(YES + "def add(x, y):\n    return Yes()\nswap = add", None, tests) == 0.0


def test_a_program_reading_its_callers_frames_finds_no_expected_value(score):
    """Only evaluated inputs go in (``square(2)``, not ``case``): a program that looks up
    the loop's ``case`` in every frame above it finds nothing to copy."""
    tests = _meta(TOP + "for case in [(2, 4), (3, 9)]:\n    assert square(case[0]) == case[1]")
    thief = ("import sys\ndef square(x):\n    if x == 0:\n        return 0\n"
             "    frame = sys._getframe(1)\n    while frame is not None:\n"
             "        for scope in (frame.f_locals, frame.f_globals):\n"
             "            if 'case' in scope:\n                return scope['case'][1]\n"
             "        frame = frame.f_back\n    return -1")
    assert score(thief, None, tests) == 0.0
    assert score(HONEST, None, tests) == 1.0
