"""Code rewards cannot be forged: the harness owns the verdict (issue 12, item 2).

Each forge below scored 1.0 before, in every sandbox mode: the program's own process
ran the tests and its exit status was the verdict. Now only the expressions enter the
sandbox, their values come back as text, and the parent compares them with literals the
program never saw (stages/sandbox/harness.py)."""

from __future__ import annotations

import json

import pytest

from stages import CodeTests, Sandbox
from stages.sandbox.harness import passed, plan
from stages.sandbox import unavailable
from tests.resources.rollouts import context
from tests.resources.sandbox_users import require

TESTS = json.dumps({"tests": ["assert square(3) == 9", "assert square(-2) == 4",
                              "assert [square(x) for x in range(3)] == [0, 1, 4]"]})
FORGES = {
    "exit before the tests": "import os\nos._exit(0)",
    "an __eq__ that always says yes": (
        "class Yes:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def square(x):\n    return Yes()"),
    "an int whose __eq__ always says yes": (
        "class Yes(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def square(x):\n    return Yes(0)"),
    "a result claiming a pass written to the channel, then exit": (
        "import os\nos.write(3, b'[\"True\", \"True\", \"True\"]')\nos._exit(0)"),
    "a sys.exit(0) from inside the function": (
        "import sys\ndef square(x):\n    sys.exit(0)"),
    "builtins and json patched to print a pass": (
        "import builtins, json\nbuiltins.repr = lambda value: 'True'\n"
        "json.dumps = lambda value: '[\"True\", \"True\", \"True\"]'\n"
        "def square(x):\n    return None"),
    "an AssertionError swallowed by a global hook": (
        "import sys\nsys.excepthook = lambda *a: None\n"
        "def square(x):\n    raise AssertionError"),
}


@pytest.fixture(scope="module")
def score():
    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    return CodeTests(sandbox=Sandbox(wall_seconds=5.0)).scorer(context())


@pytest.mark.parametrize("forge", FORGES)
def test_a_forged_pass_scores_nothing(score, forge):
    assert score(FORGES[forge], None, TESTS) == 0.0


def test_honest_code_still_scores(score):
    assert score("def square(x):\n    return x * x", None, TESTS) == 1.0
    assert score("def square(x):\n    return x + x", None, TESTS) == 0.0
    assert score("def square(x):\n    return float(x * x)", None, TESTS) == 1.0  # as == says


def test_the_expected_values_never_enter_the_sandbox():
    steps = plan("def f(x):\n    return x", "import math\nassert f(2) == 1234567\n"
                                           "assert 7654321 == f(math.floor(3.5))\n"
                                           "for x, y in [(5, 2345678)]:\n    assert f(x) == y\n"
                                           "for case in [(6, 3456789)]:\n"
                                           "    assert f(case[0]) == case[1]")
    for secret in ("1234567", "7654321", "2345678", "3456789"):
        assert secret not in steps.program
    assert "lambda x=5: (f(x))" in steps.program  # an input goes in, its answer does not
    ok = [["ok", ["int", "1234567"]], ["ok", ["int", "7654321"]], ["ok", ["int", "2345678"]],
          ["ok", ["int", "3456789"]]]
    assert passed(steps, json.dumps(ok)) == (True, "")
    assert passed(steps, json.dumps(ok[:2]))[0] is False
    forged = json.dumps([ok[0], ["unreadable", "Yes: int"], *ok[2:]])
    assert "unreadable: Yes" in passed(steps, forged)[1]


@pytest.mark.parametrize("test", [
    "assert f(2) == f(3)",
    "def helper(v):\n    return v == 4\nassert helper(f(2))",
    "assert [f(x) == y for x, y in [(2, 4)]] == [True]",
    "while True:\n    assert f(2) == 4",
    "for x in f(3):\n    assert x == 1",
    "if f(1):\n    assert f(2) == 4",
    "try:\n    assert f(2) == 4\nexcept Exception:\n    pass",
    "import numpy as np\nassert np.allclose(f(2), [4])",
    "if f(2) != 4:\n    raise AssertionError",
])
def test_a_check_the_program_could_forge_is_refused(test):
    with pytest.raises(ValueError, match="only asserts the harness judges outside"):
        plan("def f(x):\n    return x", test + "\nassert f(1) == 1")
    with pytest.raises(ValueError, match="the tests hold no assert"):
        plan("def f(x):\n    return x", "import math")


def test_a_loop_that_collects_results_sends_in_inputs_not_the_cases():
    steps = plan("def f(x):\n    return x", "cases = [(2, 4567890)]\nout = []\n"
                 "for x, y in cases:\n    out.append(f(x))\n"
                 "assert out == [y for x, y in cases]")
    assert "4567890" not in steps.program and "x = 2" in steps.program
    assert passed(steps, json.dumps([["ok", ["list", [["int", "4567890"]]]]])) == (True, "")
