"""The pool key (gfcr.transport.remote.keys) and the list of code a worker resolves by import path
(gfcr.config.refs): what an engine worker requires before it runs a call (issue 26)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfcr.config import refs
from gfcr.transport.remote.call import ScoreCall
from gfcr.transport.remote.keys import KeyProblem, load_key, new_key, sign, signed_by


def _call(**update: object) -> ScoreCall:
    fields: dict = dict(run_id="r", step=0, seed=0, policy_version=0,
                        stage={"type": "verify", "scorer": "task"}, task={"type": "t"},
                        rows="/x/staging/r/remote/rows.parquet",
                        out="/x/staging/r/remote/out.parquet", code_hash="c", spec_hash="s")
    fields.update(update)
    return ScoreCall(**fields)


def test_a_signature_covers_every_field_and_the_calls_kind(tmp_path: Path) -> None:
    key = load_key(new_key(tmp_path / "k"))
    call = _call()
    mac = sign("score", call, key)
    assert signed_by("score", ScoreCall.model_validate(call.model_dump(mode="json")), mac, key)
    assert not signed_by("generate", call, mac, key)
    assert not signed_by("score", _call(out="/elsewhere/out.parquet"), mac, key)
    assert not signed_by("score", _call(stage={"type": "verify", "scorer": "builtins:exec"}),
                         mac, key)
    assert not signed_by("score", call, mac, load_key(new_key(tmp_path / "other")))


def test_a_key_missing_short_or_readable_by_others_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GFCR_POOL_KEY_FILE", raising=False)
    with pytest.raises(KeyProblem, match="need a pool key: name its file with --key-file"):
        load_key(None)
    with pytest.raises(KeyProblem, match="cannot read it"):
        load_key(tmp_path / "none")
    short = tmp_path / "short"
    short.write_text("abc")
    os.chmod(short, 0o600)
    with pytest.raises(KeyProblem, match="holds 3 characters; a key needs at least 32"):
        load_key(short)
    shared = new_key(tmp_path / "shared")
    os.chmod(shared, 0o644)
    with pytest.raises(KeyProblem, match="may be read by others .*chmod 600"):
        load_key(shared)
    monkeypatch.setenv("GFCR_POOL_KEY_FILE", str(new_key(tmp_path / "env")))
    assert len(load_key(None)) == 64


def test_a_worker_resolves_only_the_code_on_its_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from stages import Verify

    monkeypatch.setattr(refs, "_ALLOWED", None)
    assert refs.resolve("os.path:join", "scorer") is os.path.join  # a run's own config
    refs.allow(["tests.resources.digits:Digits"], ["json"])
    with pytest.raises(refs.RefRefused, match="'builtins:exec' is not on this engine"):
        refs.resolve("builtins:exec", "scorer")
    with pytest.raises(refs.RefRefused):
        Verify(scorer="builtins:exec").verifier().scorer(None)  # type: ignore[arg-type]
    assert refs.resolve("json:dumps", "scorer") is not None  # an --import module's name
    with pytest.raises(refs.RefRefused):
        refs.resolve("json:_default_encoder", "scorer")
    assert refs.resolve("tests.resources.digits:Digits", "task").__name__ == "Digits"
    dumped = Verify(scorer="builtins:exec").model_dump(mode="json")
    assert refs.named_in({"stage": dumped, "hooks": [{"errors": "m:f"}]}) == [
        "builtins:exec", "m:f"]


def test_a_worker_admits_a_signed_call_once_with_its_files_in_its_runs_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gfcr.transport.remote import guard
    from gfcr.transport.remote.call import CallRefused

    key = load_key(new_key(tmp_path / "k"))
    monkeypatch.setattr(guard, "_KEY", [key])
    monkeypatch.setattr(guard, "_SEEN", type(guard._SEEN)())
    monkeypatch.setattr(refs, "_ALLOWED", None)
    staging = tmp_path / "staging" / "r" / "remote"
    call = _call(rows=str(staging / "rows.parquet"), out=str(staging / "out.parquet"))
    with pytest.raises(CallRefused, match="staging folder .* is missing"):  # its run has ended
        guard.admit("score", call, sign("score", call, key), "w", "t1")
    staging.mkdir(parents=True)
    guard.admit("score", call, sign("score", call, key), "w", "t1")
    guard.admit("score", call, sign("score", call, key), "w", "t1")  # delivered again
    with pytest.raises(CallRefused, match="a replayed call"):  # another task run, same call
        guard.admit("score", call, sign("score", call, key), "w", "t2")
    for bad in (dict(out=str(tmp_path / "out.parquet")),
                dict(rows=str(tmp_path / "rows.parquet")),
                dict(out=str(staging / ".." / "remote" / "x.parquet")),
                dict(out=str(staging / "out.sh"))):
        other = _call(**{"rows": call.rows, "out": call.out, **bad})
        with pytest.raises(CallRefused, match="staging folder|not a file of its staging"):
            guard.admit("score", other, sign("score", other, key), "w", "t3")
    (tmp_path / "elsewhere").mkdir()
    linked = tmp_path / "staging" / "l" / "remote"
    linked.parent.mkdir()
    linked.symlink_to(tmp_path / "elsewhere")
    via_link = _call(run_id="l", rows=str(linked / "rows.parquet"),
                     out=str(linked / "out.parquet"))
    with pytest.raises(CallRefused, match="reached through a link"):
        guard.admit("score", via_link, sign("score", via_link, key), "w", "t4")
    expired = _call(rows=call.rows, out=str(staging / "late.parquet"), expires=1.0)
    with pytest.raises(CallRefused, match="expired"):
        guard.admit("score", expired, sign("score", expired, key), "w", "t5")
