"""A published weights version checked before anyone loads it (issue 30): the folder is a
version folder under an allowed root, its manifest names plain files of its own folder,
and each file's bytes match the SHA-256 the publisher wrote (gfcr.weights.versions).

A fleet server (gfcr.transport.fleet_extension, behind gfcr.transport.fleet_gate) loads
only what :func:`check` accepts, so a request naming another folder (``/etc``, another
run's, a hand-made one), a manifest naming ``../x`` or ``/etc/passwd``, a symlink out of
the folder, or a file changed after publication is refused before anything is read into
the model. The bytes are read once, hashed and handed on (:attr:`Checked.blobs`): what is
loaded is what was hashed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
VERSION_FOLDER = re.compile(r"v(\d{6,})")
PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A file name a manifest may list: no separator, no ``..``, not hidden."""
MAX_MANIFEST = 1 << 20


class BadVersion(ValueError):
    """A folder that is not a complete, intact published version under the allowed root;
    the message names the folder and what is wrong."""


@dataclass(frozen=True)
class Checked:
    """A version that passed :func:`check`."""

    version: int
    ident: str
    folder: Path
    blobs: dict[str, bytes]
    """File name -> its bytes, as hashed."""


def digest(path: Path) -> str:
    """The SHA-256 of a file, hex (what a manifest's ``sha256`` holds per file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check(folder: str | Path, root: str | Path) -> Checked:
    """``folder`` checked as a published version under ``root`` (see the module); its
    files read and hash-checked. BadVersion otherwise."""
    given = Path(folder)
    if not given.is_absolute():
        raise BadVersion(f"weights folder {str(folder)!r} is not an absolute path")
    real, allowed = given.resolve(), Path(root).resolve()
    if allowed not in real.parents:
        raise BadVersion(f"weights folder {str(folder)!r} is not under the server's weights "
                         f"root {str(allowed)!r} (`gfcr engine serve --weights-root`)")
    match = VERSION_FOLDER.fullmatch(real.name)
    if match is None:
        raise BadVersion(f"weights folder {str(folder)!r} is not a published version "
                         f"(vNNNNNN, gfcr.weights.versions)")
    info = _manifest(real)
    files, hashes = info.get("files"), info.get("sha256")
    if not isinstance(files, list) or not files or not isinstance(hashes, dict):
        raise BadVersion(f"{real / MANIFEST}: needs a non-empty 'files' list and a 'sha256' "
                         f"map (published by a gfcr older than issue 30? publish again)")
    if info.get("version") != int(match.group(1)):
        raise BadVersion(f"{real / MANIFEST}: version {info.get('version')!r} is not the "
                         f"folder's {int(match.group(1))}")
    blobs = {name: _read(real, name, hashes.get(name)) for name in files}
    return Checked(int(match.group(1)), str(info.get("id", "")), real, blobs)


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MANIFEST:
            raise BadVersion(f"{path}: not a regular file of at most {MAX_MANIFEST} bytes")
        loaded = json.loads(path.read_bytes())
    except OSError as err:
        raise BadVersion(f"{folder}: no readable {MANIFEST} ({err.strerror}): not a "
                         f"complete published version") from None
    except ValueError as err:
        raise BadVersion(f"{path}: not JSON ({err})") from None
    if not isinstance(loaded, dict):
        raise BadVersion(f"{path}: not a JSON object")
    return loaded


def _read(folder: Path, name: object, expected: object) -> bytes:
    """The bytes of the manifest's file ``name``, checked: a plain name of a regular file
    in ``folder`` (no symlink), whose SHA-256 is ``expected``."""
    if not isinstance(name, str) or not PLAIN.fullmatch(name) or name == MANIFEST:
        raise BadVersion(f"{folder / MANIFEST}: file name {name!r} is not a plain name of "
                         f"a file in the version's own folder")
    path = folder / name
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            raise BadVersion(f"{path}: not a regular file (a symlink or a folder)")
        data = path.read_bytes()
    except OSError as err:
        raise BadVersion(f"{path}: cannot read it ({err.strerror})") from None
    actual = hashlib.sha256(data).hexdigest()
    if not isinstance(expected, str) or not hmac.compare_digest(actual, expected):
        raise BadVersion(f"{path}: SHA-256 {actual} is not the manifest's {expected!r} "
                         f"(changed after publication)")
    return data
