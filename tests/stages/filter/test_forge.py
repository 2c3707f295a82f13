"""Code rewards cannot be forged: the harness owns the verdict (issue 12, item 2).

Each forge below scored 1.0 before, in every sandbox mode: the program's own process
ran the tests and its exit status was the verdict. Now only the expressions enter the
sandbox, their values come back as text, and the parent compares them with literals the
program never saw (stages/filter/harness.py)."""

from __future__ import annotations

import json

import pytest

from stages import CodeTests, Sandbox
from stages.filter.harness import passed, plan
from stages.filter.sandbox import unavailable
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
                                           "assert 7654321 == f(math.floor(3.5))")
    assert "1234567" not in steps.program and "7654321" not in steps.program
    assert [c.expected for c in steps.checks] == [1234567, 7654321]
    assert passed(steps.checks, json.dumps(["1234567", "7654321"])) == (True, "")
    assert passed(steps.checks, json.dumps(["1234567"]))[0] is False
    assert "not a plain literal" in passed(steps.checks, json.dumps(["1234567", "<Yes>"]))[1]


@pytest.mark.parametrize("test", ["assert f(2)", "assert f(2) != 3", "x = 4\nassert f(2) == x",
                                  "assert f(2) == 4 == f(3)"])
def test_a_check_the_program_could_forge_is_refused(test):
    with pytest.raises(ValueError, match="only such tests are checked outside the program"):
        plan("def f(x):\n    return x", test)
    with pytest.raises(ValueError, match="no `assert <expression> == <literal>`"):
        plan("def f(x):\n    return x", "import math")
