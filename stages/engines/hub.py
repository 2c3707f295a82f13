"""A model named by its Hugging Face hub id, found through ``huggingface_hub``.

:func:`local_folder` turns ``HFCheckpoint.path`` into a folder: an existing directory as it
is; anything else shaped like a hub id (``org/name``) is looked up in the user's hub
cache first (``HF_HUB_CACHE``, ``~/.cache/huggingface/hub`` by default) and downloaded
into it only when that misses and the hub is not offline (``HF_HUB_OFFLINE=1``). An id the
cache lacks in offline mode fails naming the id, the revision and the cache searched.
"""

from __future__ import annotations

import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
"""``name`` or ``org/name``: the hub's repository ids."""


def is_hub_id(path: str) -> bool:
    """Whether ``path`` reads as a hub id rather than a folder path."""
    return bool(_HUB_ID.match(path)) and not path.startswith((".", "~"))


def local_folder(path: str, revision: str | None) -> Path:
    """The folder of ``path``: itself when it is a directory, else the hub snapshot of
    the id ``path`` at ``revision`` (cache first, then the network unless offline)."""
    if Path(path).is_dir():
        if revision is not None:
            raise ValueError(f"hf_checkpoint: revision={revision!r} applies to a hub id, "
                             f"but path={path!r} is a local folder")
        return Path(path)
    if not is_hub_id(path):
        raise FileNotFoundError(f"hf_checkpoint: path={path!r} is neither a directory nor a "
                                "hub id (org/name)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(path, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        pass  # not in the cache (or that revision is not)
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"hf_checkpoint: hub id {path!r} (revision {revision or 'main'!r}) is not in the "
            f"Hugging Face cache {cache!r} and the hub is offline (HF_HUB_OFFLINE); download "
            f"it where there is a network (`hf download {path}`) or point HF_HUB_CACHE at a "
            "cache that holds it")
    try:
        return Path(snapshot_download(path, revision=revision))
    except Exception as err:  # network, missing repo, auth: one message naming the id
        raise FileNotFoundError(f"hf_checkpoint: hub id {path!r} (revision "
                                f"{revision or 'main'!r}) is not in the cache {cache!r} and "
                                f"could not be downloaded: {type(err).__name__}: {err}"
                                ) from err
