"""A scripted engine for generator tests: next-token distributions are a table keyed by
the text so far, decoding is greedy, so every tree and hint has a known answer.

Characters are tokens (``ord``), token 0 is EOS. Text the script does not list ends with
EOS for sure. ``policy.model`` is a torch module returning the script's log-probabilities
as logits, so teacher-forced passes (branch points, hint logprobs) see the same policy.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from gfcr.core.engine import GenOutput, GenRequest, Inflight, SamplingParams, SegmentHook

EOS = 0
VOCAB = 128


class _Tokenizer:
    eos_token_id = EOS
    pad_token_id = EOS

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


class _Model(torch.nn.Module):
    def __init__(self, script: dict[str, dict[str, float]]):
        super().__init__()
        self.script = script
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the module a device

    def forward(self, input_ids, attention_mask=None, **_):
        out = torch.full((*input_ids.shape, VOCAB), -1e9)
        for b, row in enumerate(input_ids.tolist()):
            for t in range(len(row)):
                for tok, p in distribution(self.script, row[:t + 1]).items():
                    out[b, t, tok] = math.log(p)
        return SimpleNamespace(logits=out)


def distribution(script: dict[str, dict[str, float]], ids: list[int]) -> dict[int, float]:
    text = "".join(chr(i) for i in ids if i != EOS)
    if ids and ids[-1] == EOS:
        return {EOS: 1.0}
    return {(EOS if c == "<eos>" else ord(c)): p
            for c, p in script.get(text, {"<eos>": 1.0}).items()}


class ScriptedEngine:
    """Greedy decoding of a script; honours prefixes, caps, stop decisions, the hook and
    ``top_logprobs`` (the script's most likely tokens; ties by token id)."""

    def __init__(self, script: dict[str, dict[str, float]]):
        self.policy = SimpleNamespace(model=_Model(script), tokenizer=_Tokenizer(), version=0)
        self.calls: list[list[GenRequest]] = []

    @property
    def script(self) -> dict[str, dict[str, float]]:
        return self.policy.model.script

    @property
    def version(self) -> int:
        return self.policy.version

    def encode(self, text: str) -> list[int]:
        return self.policy.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.policy.tokenizer.decode(ids)

    def forced_logprobs(self, prompt_ids: list[int], ids: list[int],
                        temperature: float) -> list[float]:
        """A teacher-forced pass over the script's module (``teacher_forcing``)."""
        from stages.engines.teacher import forced_logprobs

        return forced_logprobs(self.policy, prompt_ids, ids, temperature)

    def update_weights(self, state=None) -> int:
        """``state``: a new script (the scripted engine's weights), or None."""
        if state is not None:
            self.policy.model.script = state
        self.policy.version += 1
        return self.policy.version

    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 on_segment: SegmentHook | None = None) -> list[GenOutput]:
        self.calls.append(list(requests))
        live = {r.key: (r, list(r.prefix_ids), list(r.prefix_logprobs)) for r in requests}
        tops: dict[int, list[list[tuple[int, float]]]] = {
            r.key: [[] for _ in r.prefix_ids] if params.top_logprobs else [] for r in requests}
        done: dict[int, str] = {}
        eos = self.policy.tokenizer.eos_token_id
        if on_segment is not None:
            on_segment.wave([r.key for r in requests])  # one wave
        step = 0
        while len(done) < len(live):
            step += 1
            for key, (req, ids, lps) in live.items():
                if key in done:
                    continue
                cap = req.max_tokens or params.max_tokens
                if len(ids) >= cap:
                    done[key] = "length"
                    continue
                dist = distribution(self.script, req.prompt_ids + ids)
                tok = max(dist, key=lambda t: (dist[t], -t))
                ids.append(tok)
                lps.append(math.log(dist[tok]))
                if params.top_logprobs:
                    ranked = sorted(dist, key=lambda t: (-dist[t], t))[:params.top_logprobs]
                    tops[key].append([(t, math.log(dist[t])) for t in ranked])
                text = self.decode(ids[len(req.prefix_ids) - 1:] if req.prefix_ids else ids)
                if tok == eos or any(x in text for x in params.stop):
                    done[key] = "stop"
                elif len(ids) >= cap:
                    done[key] = "length"
            if on_segment and step % params.segment_tokens == 0:
                running = [Inflight(k, ids, lps, len(ids) - len(r.prefix_ids))
                           for k, (r, ids, lps) in live.items() if k not in done]
                for k, d in (on_segment(running) if running else {}).items():
                    if k in live and k not in done and d != "continue":
                        done[k] = {"stop": "aborted", "prune": "pruned"}[d]
        return [GenOutput(key=r.key, completion_ids=live[r.key][1], logprobs=live[r.key][2],
                          finish_reason=done[r.key],  # type: ignore[arg-type]
                          version_start=self.version, version_end=self.version,
                          seconds=0.0, top_logprobs=tops[r.key]) for r in requests]
