"""The rollout's one body: a trajectory of turns of token ids.

A rollout is a sequence of turns (:data:`TURN_TYPE`, the rollout table's ``turns``
column): each with its role, its source (:data:`TURN_SOURCES`: the environment, the
policy, a tool, or a forced prefix), its token ids, and, for the assistant's tokens,
their behaviour log-probabilities and loss mask. Every generate stage builds its rows
from a :class:`Trajectory` (``stages.generate.rows.rollout_row``): a single-turn sample
is the prompt (an environment turn), a forced prefix when it has one (a hint), and the
policy's turn; an episode appends the environment's observations and the policy's
replies; an agent's calls are split into trajectories by :func:`branches`.

**The flat columns are derived from the turns, here and nowhere else**: ``prompt_ids``
are the first turn's tokens, ``completion_ids`` the later turns' tokens in order,
``logprobs`` theirs (0 for a turn without any), and the learner's loss mask theirs
(False for a turn without one). :func:`flat` applies the rule to one trajectory,
:func:`gfcr.core.turncols.flat_columns` to a ``turns`` column (what
``gfcr.core.rollout.conform`` writes), and :func:`gfcr.core.turncols.single_turns` is its
inverse for a row stored with flat columns only.

Turns are appended, never re-rendered: the policy's ids exactly as generated, an
observation as the ids of its rendered delta (:mod:`gfcr.chat.formats`).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, NamedTuple, Protocol, Sequence

import pyarrow as pa

from gfcr.core.environment import Message, Tool

_IDS = pa.list_(pa.int32())


class ChatFormat(Protocol):
    """How messages become ids: the first messages once, later ones as deltas."""

    ends: frozenset[int]
    """Token ids that end a policy turn (EOS, end of turn)."""

    def first(self, messages: list[Message], tools: list[Tool]) -> list[int]:
        """Ids of the conversation's first messages, ready for the policy's turn."""
        ...

    def delta(self, messages: list[Message], closed: bool) -> list[int]:
        """Ids to append after a policy turn so the conversation goes on with
        ``messages`` and then the policy's next turn; ``closed``: that turn ended with
        one of :attr:`ends` (else the delta closes it first)."""
        ...


TURN_SOURCES = ("environment", "policy", "tool", "forced")
"""Who produced a turn's tokens: the environment (the prompt, an observation), the
policy (sampled), a tool (its output), or a forced prefix (tokens put in the policy's
mouth, e.g. ADHint's hints: in the sequence, out of the loss)."""

TURN_TYPE = pa.struct([
    pa.field("role", pa.string()),
    pa.field("source", pa.string()),
    pa.field("token_ids", _IDS),
    pa.field("logprobs", pa.list_(pa.float32())),
    pa.field("mask", pa.list_(pa.bool_())),
    pa.field("tool_name", pa.string()),
    pa.field("tool_error", pa.string()),
    pa.field("reward", pa.float64()),
])
"""One turn: ``role`` (user, assistant, tool, system), ``source`` (:data:`TURN_SOURCES`),
``token_ids``; ``logprobs`` (behaviour log-probability per token) and ``mask`` (in the
loss or not, per token) for the assistant's turns, null for the others; ``tool_name``
and ``tool_error`` for a tool call's turn; ``reward``: a per-turn reward (null: none, the
row's ``reward`` is the trajectory's)."""

TURNS_TYPE = pa.list_(TURN_TYPE)
"""The ``turns`` column's type."""

BRANCH_TYPE = pa.struct([("parent_id", pa.string()), ("turns", TURNS_TYPE)])
"""A branch: the stored row it starts from and the turns it starts with."""


@dataclass
class Turn:
    """One turn of a trajectory, in :data:`TURN_TYPE`'s fields."""

    role: str
    source: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    mask: list[bool] | None = None
    tool_name: str | None = None
    tool_error: str | None = None
    reward: float | None = None

    def as_row(self) -> dict[str, Any]:
        """The turn as a ``turns`` entry."""
        return asdict(self)


class Flat(NamedTuple):
    """A trajectory's flat columns and loss mask (the module docstring's rule)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    loss_mask: list[bool]


def flat(turns: Sequence[Turn | Mapping[str, Any]]) -> Flat:
    """The flat columns of one trajectory's turns (:class:`Turn` s or ``turns`` entries)."""
    rows = [t.as_row() if isinstance(t, Turn) else t for t in turns]
    completion: list[int] = []
    logprobs: list[float] = []
    mask: list[bool] = []
    for turn in rows[1:]:
        ids = list(turn["token_ids"] or [])
        completion += ids
        logprobs += turn["logprobs"] if turn["logprobs"] is not None else [0.0] * len(ids)
        mask += turn["mask"] if turn["mask"] is not None else [False] * len(ids)
    prompt = list(rows[0]["token_ids"] or []) if rows else []
    return Flat(prompt, completion, logprobs, mask)


def loss_mask(turns: Sequence[Turn | Mapping[str, Any]]) -> list[bool]:
    """A row's loss mask over its completion tokens, from its turns (:func:`flat`)."""
    return flat(turns).loss_mask


@dataclass
class Trajectory:
    """A conversation as turns of token ids, built by appending (never re-rendering).

    ``format`` renders messages (:mod:`gfcr.chat.formats`); a trajectory built from ids
    alone (a single-turn sample, an agent's recorded calls) needs none.
    """

    format: ChatFormat | None = None
    turns: list[Turn] = field(default_factory=list)

    @classmethod
    def of_rows(cls, rows: Sequence[Mapping[str, Any]], format: ChatFormat | None = None
                ) -> "Trajectory":
        """A trajectory from stored ``turns`` entries (a branch's start), kept as given."""
        return cls(format, [Turn(**dict(r)) for r in rows])

    def start(self, messages: list[Message], tools: Sequence[Tool] = ()) -> "Trajectory":
        """The first turn: ``messages`` rendered once (an environment turn)."""
        return self.start_ids(self._format().first(messages, list(tools)), _role(messages))

    def start_ids(self, ids: Sequence[int], role: str = "user") -> "Trajectory":
        """The first turn as ids already rendered (an environment turn)."""
        if self.turns:
            raise ValueError("the trajectory has already started")
        self.turns.append(Turn(role, "environment", list(ids)))
        return self

    def add_policy(self, ids: Sequence[int], logprobs: Sequence[float]) -> "Trajectory":
        """The policy's turn: its ids exactly as generated, in the loss."""
        self._check(ids, logprobs, "policy")
        self.turns.append(Turn("assistant", "policy", list(ids), list(logprobs),
                               [True] * len(ids)))
        return self

    def force(self, ids: Sequence[int], logprobs: Sequence[float]) -> "Trajectory":
        """A forced prefix of the policy's turn (a hint): in the sequence, with the
        policy's teacher-forced logprobs, out of the loss; nothing when ``ids`` is empty."""
        self._check(ids, logprobs, "forced")
        if ids:
            self.turns.append(Turn("assistant", "forced", list(ids), list(logprobs),
                                   [False] * len(ids)))
        return self

    def observe(self, messages: list[Message], *, tool_name: str | None = None,
                tool_error: str | None = None) -> "Trajectory":
        """Append an observation after the policy's last turn, as its delta's ids."""
        last = self.turns[-1] if self.turns else None
        if last is None or last.source != "policy":
            raise ValueError("an observation must follow a policy turn")
        closed = bool(last.token_ids) and last.token_ids[-1] in self._format().ends
        ids = self._format().delta(messages, closed)
        return self.add_observation(ids, _role(messages), tool_name=tool_name,
                                    tool_error=tool_error)

    def add_observation(self, ids: Sequence[int], role: str, *, tool_name: str | None = None,
                        tool_error: str | None = None) -> "Trajectory":
        """An environment's (or, for role ``tool`` or a named tool, a tool's) turn as ids
        already rendered: out of the loss."""
        source = "tool" if role == "tool" or tool_name is not None else "environment"
        self.turns.append(Turn(role, source, list(ids), tool_name=tool_name,
                               tool_error=tool_error))
        return self

    def fork(self, at_turn: int) -> "Trajectory":
        """A new trajectory with (copies of) the first ``at_turn`` turns: a branch."""
        if not 0 < at_turn <= len(self.turns):
            raise ValueError(f"cannot fork at turn {at_turn} of {len(self.turns)}")
        return Trajectory(self.format, copy.deepcopy(self.turns[:at_turn]))

    def reward_last(self, reward: float | None) -> None:
        """Give the policy's last turn its reward."""
        if reward is not None:
            policy = [t for t in self.turns if t.source == "policy"]
            policy[-1].reward = float(reward)

    def ids(self) -> list[int]:
        """Every token so far: the context the policy's next turn continues."""
        return [i for t in self.turns for i in t.token_ids]

    def flat(self) -> Flat:
        """Its flat columns (:func:`flat`)."""
        return flat(self.turns)

    @property
    def prompt_ids(self) -> list[int]:
        return self.flat().prompt_ids

    @property
    def completion_ids(self) -> list[int]:
        return self.flat().completion_ids

    @property
    def logprobs(self) -> list[float]:
        """The policy's logprobs, 0 for every token of a turn without any."""
        return self.flat().logprobs

    def policy_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns if t.source == "policy")

    def forced_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns if t.source == "forced")

    def reward(self) -> float | None:
        """The sum of the turns' rewards; None when no turn has one."""
        given = [t.reward for t in self.turns if t.reward is not None]
        return float(sum(given)) if given else None

    def rows(self) -> list[dict[str, Any]]:
        """The ``turns`` column's value."""
        return [t.as_row() for t in self.turns]

    def _format(self) -> ChatFormat:
        if self.format is None:
            raise ValueError("this trajectory has no chat format: give it ids, not messages")
        return self.format

    @staticmethod
    def _check(ids: Sequence[int], logprobs: Sequence[float], what: str) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"a {what} turn has {len(ids)} ids but {len(logprobs)} logprobs")


def _role(messages: list[Message]) -> str:
    roles = {m.role for m in messages}
    return roles.pop() if len(roles) == 1 else "user"


# ----------------------------------------------------------- an agent's calls as branches


@dataclass(frozen=True)
class Exchange:
    """One call to the policy: the ids it was given (the whole context), the role of the
    last message new in it and the tools whose results are among them, and the ids the
    policy generated with their logprobs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    role: str = "user"
    tool_names: tuple[str, ...] = ()


@dataclass
class Branch:
    """A trajectory split from a run of calls: the branch it left (an index into the
    list :func:`branches` returns, or None) and the calls it holds (indices)."""

    trajectory: Trajectory
    parent: int | None
    calls: list[int]


def branches(calls: Sequence[Exchange]) -> list[Branch]:
    """Calls, in order, as trajectories: a call whose prompt ids start with a
    trajectory's ids so far is that trajectory's next turn (the new ids an environment or
    tool turn, out of the loss; the generated ids a policy turn). A call that extends no
    trajectory starts a new one, a branch whose parent is the trajectory it shares the
    longest token prefix with (latest on ties; rLLM and verifiers split such episodes
    the same way)."""
    out: list[Branch] = []
    for n, call in enumerate(calls):
        extended = next((b for b in reversed(out) if _extends(call.prompt_ids,
                                                              b.trajectory.ids())), None)
        if extended is None:
            extended = Branch(Trajectory().start_ids(call.prompt_ids),
                              _closest(call.prompt_ids, out), [])
            out.append(extended)
        else:
            delta = call.prompt_ids[len(extended.trajectory.ids()):]
            tool = call.role == "tool"
            extended.trajectory.add_observation(
                delta, call.role, tool_name=",".join(call.tool_names) if tool else None)
        extended.trajectory.add_policy(call.completion_ids, call.logprobs)
        extended.calls.append(n)
    return out


def _extends(prompt: list[int], ids: list[int]) -> bool:
    return len(prompt) >= len(ids) and prompt[:len(ids)] == ids


def _closest(prompt: list[int], rows: list[Branch]) -> int | None:
    """The trajectory sharing the longest token prefix with ``prompt`` (latest on ties)."""
    best, best_len = None, -1
    for i, row in enumerate(rows):
        ids, n = row.trajectory.ids(), 0
        while n < min(len(ids), len(prompt)) and ids[n] == prompt[n]:
            n += 1
        if n >= best_len:
            best, best_len = i, n
    return best

