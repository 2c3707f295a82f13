"""An arithmetic agent written against nothing but the ``openai`` package (and the
standard library): it declares a calculator tool, runs the calls the model makes with a
safe evaluator, and answers. gfcr trains the model behind the client:

    AgentEnv(agent="examples.agent_calculator:solve", n=8)    # pipelines/agent.py

The same function runs unchanged against any OpenAI-compatible server:

    python examples/agent_calculator.py http://localhost:8000/v1 "What is 12 * 7?"
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sys

import openai

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and brackets).",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]
MAX_TURNS = 3
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, or an error message; never runs code
    (only number literals and the operators above, exponents up to 100)."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported: {ast.dump(node)[:40]}")
    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError) as err:
        return f"error: {err}"
    return str(int(result)) if float(result).is_integer() else str(result)


def solve(client: openai.OpenAI, task: dict) -> float:
    """Answer ``task["question"]``, calling the calculator when the model asks; 1.0 when
    the last number of the final answer equals ``task["answer"]``."""
    model = client.models.list().data[0].id
    messages: list = [{"role": "user", "content": task["question"]}]
    answer = ""
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               max_tokens=32)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        answer = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculate(str(expression))})
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return float(bool(numbers) and numbers[-1] == str(task.get("answer")).strip())


if __name__ == "__main__":
    url, question = sys.argv[1], sys.argv[2]
    print(solve(openai.OpenAI(base_url=url, api_key="none"), {"question": question,
                                                                "answer": None}))
