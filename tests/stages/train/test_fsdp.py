"""The sharded learner (gfcr.transport.sharded, stages.train.fsdp): two real torchrun processes over
gloo, against the single-process GRPO learner on the same tiny Llama.

A 2-rank and a 1-rank process group serve the module (``restart`` gives one another stage
and the initial weights), since starting one costs tens of seconds on a loaded 2-core
machine; the tests that end a group run last."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from gfcr.core.pipeline import Checkpointing, LearnerPlacement, PipelineError
from gfcr.core.stage import StepContext
from gfcr.launch.run import execute
from gfcr.checkpoints import checkpoint
from gfcr.transport.sharded import Setup, ShardedLearner, ShardedLearnerError
from stages import GroupSample, UniformSampler, Verify
from stages.train.grpo import GRPO
from tests.conftest import tiny_pipeline
from tests.stages.train.conftest import TINY, rollouts
from tests.stages.train.test_train_pipelines import digit_share

REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 0.2, 0.0, 0.7]
GROUPS = ["a"] * 4 + ["b"] * 4
LONG = ["3", "9", "12", "14", "111", "2", "1234", "77"]
"""Completions of 2 to 5 tokens: the ranks get unequal rows and micro-batch counts."""


def _batch(policy, step: int, **extra) -> pa.Table:
    rewards = [(r + 0.3 * step) % 1.0 for r in REWARDS]
    return rollouts(policy, rewards, GROUPS, completions=LONG, **extra)


def _ctx(step: int, version: int | None = None) -> StepContext:
    return StepContext(run_id="t", step=step, seed=0,
                       policy_version=step if version is None else version, task=None)


def _learner(where: Path, ranks: int) -> ShardedLearner:
    setup = Setup(policy=TINY, stage=GRPO(), seed=0, run_id="t", weights=str(where / "w"),
                  keep=3, device="cpu", offload=False, timeout_s=120)
    return ShardedLearner(setup, ranks, TINY.build(seed=0), where)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory):
    """Two ranks; the kill test (the last to use it) ends them."""
    learner = _learner(tmp_path_factory.mktemp("fsdp"), 2)
    yield learner
    learner.close()


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory):
    """One rank; the error test (the last to use it) ends it."""
    learner = _learner(tmp_path_factory.mktemp("fsdp1"), 1)
    yield learner
    learner.close()


def _weights(handle) -> dict[str, torch.Tensor]:
    return load_file(str(handle.file))


def _max_diff(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert ours.keys() <= theirs.keys()
    return max(float((ours[k] - theirs[k]).abs().max()) for k in ours)


STALE = dict(policy_version_start=[1, 3, 0, 3, 3, 2, 3, 3], replay_count=[0] * 8,
             shift=[[0.3, -0.2, 0.1, 0.0, 0.2]] * 8)
VARIANTS = {
    "seq_mean": (GRPO(lr=1e-3, micro_batch=2), {}),
    "token_mean": (GRPO(lr=1e-3, micro_batch=2, aggregation="token_mean"), {}),
    "dr_grpo": (GRPO(lr=1e-3, micro_batch=3, advantage="drgrpo",
                     aggregation="seq_mean_token_sum_norm"), {}),
    "gspo": (GRPO(lr=1e-3, micro_batch=2, ratio_level="sequence", clip_low=3e-4,
                  clip_high=4e-4), {}),
    "rloo_kl_entropy": (GRPO(lr=1e-3, micro_batch=2, advantage="rloo", kl_coef=0.1,
                             entropy_coef=0.01), {}),
    "stale_rows_tis_two_epochs": (GRPO(lr=1e-3, micro_batch=2, epochs=2, tis_cap=1.5), STALE),
    "d3s_token_share": (GRPO(lr=1e-3, micro_batch=2), {"token_keep_ratio": [0.5] * 8}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_loss_of_the_grpo_family_matches_one_process(sharded, name):
    """Two updates (the second on stale behaviour logprobs): loss, gradient norm, the
    other metrics and every new weight equal the single-process learner's."""
    stage, extra = VARIANTS[name]
    policy = TINY.build(seed=0)
    single = stage.learner(policy, seed=0)
    sharded.restart(stage)
    version = 3 if extra.get("policy_version_start") else None
    for step in range(2):
        batch = _batch(policy, step, **extra)
        ctx = _ctx(step, None if version is None else version + step)
        want = single.update(ctx, batch)
        got, handle = sharded.update(ctx, batch)
        assert got.advantages == want.advantages
        for key in ("loss", "grad_norm", "clip_frac", "approx_kl", "n_tokens", "n_seqs",
                    "loss_token_share"):
            assert got.metrics[key] == pytest.approx(want.metrics[key], rel=1e-4, abs=1e-6), key
        assert want.metrics["grad_norm"] > 0
        assert handle.version == step + 1
    assert _max_diff(_weights(handle), policy.model.state_dict()) < 1e-5


def test_published_weights_reach_the_ranks_and_their_logprobs_match(sharded):
    """A warm start changes the run's own policy; ``publish`` sends it to the ranks (the
    file names a tied weight once), whose teacher-forced logprobs are then the policy's."""
    sharded.restart(GRPO())
    torch.manual_seed(0)
    with torch.no_grad():
        for p in sharded.policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert sharded.publish().version == 1
    prompts, completions = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]]
    want = GRPO().learner(sharded.policy, seed=0).logprobs(prompts, completions, 1.0)
    got = sharded.logprobs(prompts, completions, 1.0)
    fresh = GRPO().learner(TINY.build(seed=0), seed=0).logprobs(prompts, completions, 1.0)
    assert [len(r) for r in got] == [2, 3]
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w)) < 1e-5
    assert max(abs(a - b) for g, w in zip(got, fresh) for a, b in zip(g, w)) > 1e-3


def _listening(pids: list[int]) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) the processes listen on."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.append(fields[1].split(":")[0])
    return found


def test_rendezvous_binds_loopback(sharded):
    """Drill T1: torchrun's c10d store listened on every interface and took anyone's
    reads and writes. The ranks meet in a file store now; what they listen on (gloo's
    pairs) is the loopback address alone."""
    assert sharded.logprobs([[5]], [[6]], 1.0)  # the group is up and has talked
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
               for pid in sharded.pids} - {os.getpid()}  # a launcher between us and them
    addresses = _listening([*sharded.pids, *parents])
    assert set(addresses) <= loopback, addresses


def test_idle_connections_do_not_hold_the_accept_loop(tmp_path):
    """Drill T3: peers that connect and send nothing held the serial accept loop for 10 s
    each, so 3 of them outlasted a start-up deadline; now every answer is read as it
    comes, and the two ranks are admitted within a deadline shorter than one hello's. A
    peer without the key is refused (its connection closed, nothing of it read on), and
    a rank learns the host holds the key before it reads a frame."""
    import secrets
    import socket
    import struct
    import threading

    from gfcr.procs import wire
    from gfcr.transport import sharded_ranks

    class Alive:  # the ranks' processes, still running
        procs = [None, None]

        def exited(self) -> bool:
            return False

    server = socket.create_server(("127.0.0.1", 0))
    key = secrets.token_bytes(16)
    idle = [socket.create_connection(server.getsockname()) for _ in range(4)]
    joined: dict[str, object] = {}

    def join(name: str, with_key: bytes, rank: int) -> None:
        try:
            joined[name] = wire.join(server.getsockname(), with_key, struct.pack("!I", rank))
        except (wire.Refused, wire.PeerGone, OSError) as err:
            joined[name] = err

    threads = [threading.Thread(target=join, args=args) for args in
               (("stranger", secrets.token_bytes(16), 0), ("r1", key, 1), ("r0", key, 0))]
    for thread in threads:
        thread.start()
    conns = sharded_ranks.accept(server, Alive(), key, timeout_s=sharded_ranks.HELLO_S - 4)
    for thread in threads:
        thread.join()
    assert len(conns) == 2
    assert isinstance(joined["r0"], socket.socket) and isinstance(joined["r1"], socket.socket)
    assert isinstance(joined["stranger"], (wire.PeerGone, OSError))  # closed on it
    wire.write_frame(conns[1].fileno(), b"to rank 1")  # by rank: the right socket
    assert wire.read_frame(joined["r1"].fileno(), cap=64) == b"to rank 1"
    for conn in [*conns, *idle, joined["r0"], joined["r1"], server]:
        conn.close()


def _save(root: Path, learner: ShardedLearner, step: int) -> checkpoint.Checkpoint:
    return checkpoint.save(root, run_id="t", step=step, spec_hash="h", policy=learner.policy,
                           learner=learner, engine=None, progress={}, keep=2)


def _resume(ckpt: checkpoint.Checkpoint, learner: ShardedLearner, stage: GRPO,
            batches: list[pa.Table]) -> list[dict[str, torch.Tensor]]:
    learner.restart(stage)
    checkpoint.restore(ckpt, policy=learner.policy, learner=learner, engine=None)
    assert learner.version == 1
    return [_weights(learner.update(_ctx(step), batch)[1])
            for step, batch in enumerate(batches, start=1)]


def test_a_killed_rank_fails_the_run_and_its_checkpoint_resumes_on_1_rank(
        sharded, alone, tmp_path):
    """Two ranks update, checkpoint (weights, AdamW state and KL reference, sharded),
    update again; kill -9 of rank 1 then fails the next update at once, naming rank 1.
    One rank resumes from the checkpoint: its updates equal the 2-rank update it
    replays and the uninterrupted single-process run's."""
    stage = GRPO(lr=1e-2, micro_batch=2, kl_coef=0.05)
    policy = TINY.build(seed=0)
    batches = [_batch(policy, step) for step in range(3)]
    single = stage.learner(policy, seed=0)
    uninterrupted = []
    for step, batch in enumerate(batches):
        single.update(_ctx(step), batch)
        uninterrupted.append({k: v.clone() for k, v in policy.model.state_dict().items()})

    sharded.restart(stage)
    sharded.update(_ctx(0), batches[0])
    ckpt = _save(tmp_path / "ckpt", sharded, 0)
    two_ranks = _weights(sharded.update(_ctx(1), batches[1])[1])
    os.kill(sharded.pids[1], signal.SIGKILL)
    with pytest.raises(ShardedLearnerError, match="rank 1"):
        sharded.update(_ctx(2), batches[2])
    with pytest.raises(ShardedLearnerError, match="failed earlier"):
        sharded.update(_ctx(2), batches[2])
    assert (ckpt.path / "learner.dcp").is_dir()

    resumed = _resume(ckpt, alone, stage, batches[1:])
    assert _max_diff(resumed[0], two_ranks) < 1e-5
    for got, want in zip(resumed, uninterrupted[1:]):
        assert _max_diff(got, want) < 1e-5
    assert _max_diff(resumed[1], load_file(str(ckpt.path / "model.safetensors"))) > 1e-4


def test_an_error_in_a_rank_names_the_rank_and_its_error(alone):
    bad = _batch(TINY.build(seed=0), 0).set_column(0, "reward", pa.array([None] * 8,
                                                                          pa.float64()))
    alone.restart(GRPO())
    with pytest.raises(ShardedLearnerError, match=r"rank 0 .*null 'reward'"):
        alone.update(_ctx(0), bad)


def test_a_run_trains_on_two_ranks_and_resumes_on_one(tmp_path):
    """The loop with ``learner.ranks=2``: the engine generates with the versions the ranks
    publish, each step's checkpoint holds their sharded state, and the run resumes on one
    rank from it (the number of ranks may change on resume)."""
    p = tiny_pipeline(steps=2, checkpoint=Checkpointing(every=1),
                      learner=LearnerPlacement(ranks=2, device="cpu", timeout_s=300),
                      stages=[UniformSampler(batch=2), GroupSample(n=4, max_tokens=4),
                              Verify(scorer=f"{digit_share.__module__}:digit_share"),
                              GRPO(lr=1e-3)])
    first = execute(p, root=tmp_path, executor="local", run_id="sharded")
    ckpt = checkpoint.latest(checkpoint.directory(tmp_path, "sharded"))
    assert ckpt is not None and ckpt.step == 1 and ckpt.manifest.policy_version == 2
    assert (ckpt.path / "learner.dcp" / ".metadata").is_file()
    assert [m["policy_version"] for m in first.history] == [1, 2]
    longer = p.model_copy(update={"steps": 3, "learner": LearnerPlacement(ranks=1,
                                                                          device="cpu")})
    resumed = execute(longer, root=tmp_path, executor="local", run_id="sharded")
    assert resumed.resumed_from == 1
    assert [m["policy_version"] for m in resumed.history] == [1, 2, 3]


def test_the_learner_placement_is_strict_and_stored_only_when_set():
    p = tiny_pipeline()
    assert p.learner.ranks == 0 and "learner" not in p.to_dict()  # older specs keep their hash
    q = p.with_overrides(["learner.ranks=2", "learner.offload=true"])
    assert q.to_dict()["learner"]["ranks"] == 2 and q.learner.offload
    with pytest.raises(PipelineError, match="learner.rank"):
        p.with_overrides(["learner.rank=2"])
    with pytest.raises(PipelineError, match="ranks"):
        tiny_pipeline(learner={"ranks": -1})
