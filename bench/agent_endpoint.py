"""AgentEnv's endpoint against direct generation: what an openai-client agent costs.

The same prompts, samples and token caps, on the tiny policy and the HF engine:

- ``group``: GroupSample, one engine call for every sample (the baseline);
- ``agent x1``: AgentEnv with an agent that makes one chat call per episode through the
  ``openai`` client: the HTTP round trip, the client, rendering and parsing on top of
  the same engine work;
- ``agent x3``: three calls per episode, each extending the conversation (three
  turn-waves, each one engine call).

Reported: seconds per setup (best of ``--repeat``), engine calls, and each agent setup's
ratio to the baseline; "per call ms" is the agent's time over the baseline's, per chat
call. Needs the ``openai`` package.

    python -m bench.agent_endpoint [--prompts 8] [--n 8] [--tokens 16] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _engine() -> Any:
    from stages import HF, TinyLlama

    from tests.resources.agents import Recording

    policy = TinyLlama(hidden_size=64, num_layers=2, num_heads=2,
                       intermediate_size=128, max_position=1024).build(seed=0)
    return Recording(HF(device="cpu").build(policy, seed=0))


def _time(stage: Any, prompts: int, repeat: int) -> tuple[float, int, int]:
    """Best wall seconds of ``stage.generate`` over ``repeat`` runs, its engine calls
    and the rows' policy tokens (of the last run)."""
    from tests.resources.agents import plan
    from tests.resources.rollouts import context

    table = plan(*[f"{i} + {i + 3} =" for i in range(prompts)])
    best, calls, tokens = float("inf"), 0, 0
    for _ in range(repeat):
        engine = _engine()
        start = time.perf_counter()
        out = stage.generate(context(), table, engine, None)
        best = min(best, time.perf_counter() - start)
        calls, tokens = len(engine.calls), sum(out.column("new_tokens").to_pylist())
    return best, calls, tokens


def measure(prompts: int, n: int, tokens: int, repeat: int) -> dict[str, Any]:
    from stages import AgentEnv, GroupSample

    setups = {"group": GroupSample(n=n, max_tokens=tokens, temperature=1.0)}
    for calls, agent in ((1, "one_call"), (3, "three_turns")):
        setups[f"agent x{calls}"] = AgentEnv(agent=f"bench.agent_endpoint:{agent}", n=n,
                                             max_tokens=tokens, window=5.0)
    rows = []
    for name, stage in setups.items():
        seconds, engine_calls, generated = _time(stage, prompts, repeat)
        rows.append({"setup": name, "seconds": seconds, "engine_calls": engine_calls,
                     "policy_tokens": generated})
    base = rows[0]["seconds"]
    for row, calls in zip(rows[1:], (1, 3)):
        row["ratio"] = row["seconds"] / base
        row["per_call_ms"] = 1000 * (row["seconds"] - calls * base) / (calls * prompts * n)
    return {"prompts": prompts, "n": n, "max_tokens": tokens, "setups": rows}


def one_call(client: Any, task: dict) -> float:
    """An agent that asks once."""
    client.chat.completions.create(model="m", max_tokens=10**6,
                                   messages=[{"role": "user", "content": task["question"]}])
    return 0.0


def three_turns(client: Any, task: dict) -> float:
    """An agent that asks three times in one conversation."""
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    for _ in range(3):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=10**6)
        messages += [reply.choices[0].message, {"role": "user", "content": "again"}]
    return 0.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    result = measure(args.prompts, args.n, args.tokens, args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.prompts} prompts x {args.n} samples, {args.tokens} tokens a call, "
          f"best of {args.repeat}")
    print(f"{'setup':<9} {'seconds':>8} {'engine calls':>13} {'policy tokens':>14} "
          f"{'ratio':>6} {'per call ms':>12}")
    for r in result["setups"]:
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "1.00"
        per = f"{r['per_call_ms']:.1f}" if "per_call_ms" in r else "-"
        print(f"{r['setup']:<9} {r['seconds']:>8.2f} {r['engine_calls']:>13} "
              f"{r['policy_tokens']:>14} {ratio:>6} {per:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
