"""The store trusts nothing it reads (issue 11): a corrupt stored profile, or one made for
another machine, is never used. recommend() warns and returns the rules-only profile; the
command exits 4 with one line naming the file and the fix; nothing on disk changes."""

from __future__ import annotations

import json
import os
import threading
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_bench import measured
from tests.test_store import NOW, snapshot
from torch_autotune import api, files
from torch_autotune.api import recommend
from torch_autotune.cli import cli
from torch_autotune.detect import RecordedMachine
from torch_autotune.errors import (
    EXIT_STORE,
    MeasuredProfileExistsError,
    StoredProfileError,
    StoredProfileWarning,
    StoreError,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import PROFILE_SCHEMA_VERSION, Profile, fingerprint
from torch_autotune.profile_io import dump_profile
from torch_autotune.rules.engine import build_profile
from torch_autotune.store import ProfileStore

T = TypeVar("T")

CPU_ONLY = "cpu-laptop-linux"
V100 = "tesla-v100-sxm2-16gb"


def valid_text() -> str:
    """The profile the store holds for the CPU-only laptop, as JSON."""
    return dump_profile(build_profile(snapshot(CPU_ONLY), now=NOW), "json")


def edited(change: Callable[[dict[str, Any]], None]) -> bytes:
    data = json.loads(valid_text())
    change(data)
    return json.dumps(data).encode()


def v100_profile(*, claim_this_machine: bool = False) -> bytes:
    """A V100's profile; with ``claim_this_machine`` its fingerprint edited to the laptop's."""
    data = json.loads(dump_profile(measured(V100), "json"))
    if claim_this_machine:
        data["provenance"]["fingerprint"] = fingerprint(snapshot(CPU_ONLY))
    return json.dumps(data).encode()


def _newer_schema(data: dict[str, object]) -> None:
    data["schema_version"] = PROFILE_SCHEMA_VERSION + 1


def _unknown_key(data: dict[str, object]) -> None:
    data["surprise"] = 1


def _no_settings(data: dict[str, object]) -> None:
    del data["settings"]


def _workers_beyond_the_machine(data: dict[str, Any]) -> None:
    data["settings"]["dataloader"]["num_workers"] = 33  # the laptop's 8 CPUs run 32 at most


def _threads_beyond_the_machine(data: dict[str, Any]) -> None:
    data["settings"]["cpu_threads"] = 9  # one a CPU of the laptop's 8: cpu_threads 64 on 2
    # CPUs loaded as 'set by hand', and apply() set 64 threads


def _threads_variable_not_a_number(data: dict[str, Any]) -> None:
    data["settings"]["environment"]["OMP_NUM_THREADS"] = "abc"  # exported as it was


BAD = {
    "not-utf8": lambda: b'{"schema_version": 1, "mode": "sp\xffeed"}',
    "binary": lambda: bytes(range(256)),
    "empty": lambda: b"",
    "truncated": lambda: valid_text().encode()[:400],
    "not-json": lambda: b"schema_version: 1\nmode: speed\n",
    "a-list": lambda: b"[]",
    "unknown-key": lambda: edited(_unknown_key),
    "missing-settings": lambda: edited(_no_settings),
    "newer-schema": lambda: edited(_newer_schema),
    "workers-beyond-its-machine": lambda: edited(_workers_beyond_the_machine),
    "threads-beyond-its-machine": lambda: edited(_threads_beyond_the_machine),
    "threads-variable-not-a-number": lambda: edited(_threads_variable_not_a_number),
    "another-machine": v100_profile,
    "another-machine-claiming-this-one": lambda: v100_profile(claim_this_machine=True),
    # A valid profile padded with 2 MiB of spaces: never read, refused from its size.
    "too-large": lambda: valid_text().encode() + b" " * (2 * 1024 * 1024),
}


def laptop_store(tmp_path: Path, content: bytes, workload: str | None = None) -> Path:
    """A store whose file for the CPU-only laptop (or its ``workload``) holds ``content``."""
    path = ProfileStore(tmp_path).path_for(fingerprint(snapshot(CPU_ONLY)), workload)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def on_the_laptop(store: Path, workload: str | None = None) -> Profile:
    return recommend(store=store, machine=RecordedMachine(snapshot(CPU_ONLY)), workload=workload)


@pytest.mark.parametrize("workload", [None, "conv"])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_recommend_warns_and_returns_the_rules_only_profile(
    tmp_path: Path, bad: str, workload: str | None
) -> None:
    content = BAD[bad]()
    path = laptop_store(tmp_path, content, workload)
    with pytest.warns(StoredProfileWarning) as caught:
        profile = on_the_laptop(tmp_path, workload)
    assert profile.measured is False
    assert profile.device == "cpu"  # the V100's 'cuda' never reaches a CPU-only machine
    assert profile.provenance.fingerprint == fingerprint(snapshot(CPU_ONLY))
    (warning,) = caught
    message = str(warning.message)
    assert str(path) in message
    assert "delete it, or run 'autotune" in message
    assert "\n" not in message
    assert path.read_bytes() == content  # reading deletes and repairs nothing


@pytest.mark.parametrize("bad", sorted(BAD))
def test_the_store_raises_one_error_naming_the_file(tmp_path: Path, bad: str) -> None:
    path = laptop_store(tmp_path, BAD[bad]())
    with pytest.raises(StoredProfileError) as caught:
        ProfileStore(tmp_path).load(fingerprint(snapshot(CPU_ONLY)))
    assert caught.value.exit_code == EXIT_STORE
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_stored_file_gets_the_stores_fix_alone(tmp_path: Path, bad: str) -> None:
    """A stored file that was not JSON read 'regenerate it with autotune export; it cannot be
    used: delete it, or run autotune': export fails on that very file."""
    laptop_store(tmp_path, BAD[bad]())
    with pytest.raises(StoredProfileError) as caught:
        ProfileStore(tmp_path).load(fingerprint(snapshot(CPU_ONLY)))
    message = str(caught.value)
    assert "autotune export" not in message
    assert message.count("delete it, or run 'autotune' to measure again") == 1


def test_a_foreign_profile_says_which_machine_it_was_made_on(tmp_path: Path) -> None:
    laptop_store(tmp_path, v100_profile())
    with pytest.raises(StoredProfileError, match=r"made for another machine .*Tesla V100"):
        ProfileStore(tmp_path).load(fingerprint(snapshot(CPU_ONLY)))


def test_an_edited_fingerprint_does_not_pass_for_this_machine(tmp_path: Path) -> None:
    laptop_store(tmp_path, v100_profile(claim_this_machine=True))
    with pytest.raises(StoredProfileError, match=r"records another machine .*Tesla V100"):
        ProfileStore(tmp_path).load(fingerprint(snapshot(CPU_ONLY)))


def test_a_stored_count_beyond_its_machine_says_so_and_the_bound(tmp_path: Path) -> None:
    path = laptop_store(tmp_path, edited(_workers_beyond_the_machine))
    with pytest.raises(StoredProfileError) as caught:
        ProfileStore(tmp_path).load(fingerprint(snapshot(CPU_ONLY)))
    assert str(caught.value).startswith(
        f"{path}: settings.dataloader.num_workers: 33 is more than the machine it was made for "
        "can run: 8 usable CPUs, at most 32 DataLoader workers (4 a CPU, for a loader that "
        "waits on storage); ask for 32 or fewer"
    )


def test_a_sound_profile_is_still_returned_without_a_warning(tmp_path: Path) -> None:
    laptop_store(tmp_path, valid_text().encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = on_the_laptop(tmp_path)
    assert profile == build_profile(snapshot(CPU_ONLY), now=NOW)


def test_a_corrupt_profile_of_an_old_fingerprint_is_no_stale_evidence(tmp_path: Path) -> None:
    """Stale detection reads every profile in the store: a corrupt one is skipped quietly."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "0123456789abcdef.json").write_bytes(b"\xff\xfe")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert on_the_laptop(tmp_path).measured is False


# --- a stored file that cannot be read, or is no file at all --------------------------------------


def _a_directory(path: Path) -> None:
    path.mkdir()


def _a_fifo(path: Path) -> None:
    os.mkfifo(path)  # nobody writes to it: a blocking open would wait for ever


def _a_link_to_a_device(path: Path) -> None:
    # /dev/null, not /dev/zero: were the read unbounded again, this test would fail, not fill
    # the memory of the machine it runs on (the FIFO already tells a read that refuses
    # anything but a regular file from one that waits)
    path.symlink_to(os.devnull)


def _a_file_in_place_of_the_store(path: Path) -> None:
    path.parent.rmdir()
    path.parent.write_text("not a directory")  # profiles/ is a file


def _no_permission(path: Path) -> None:
    path.write_text(valid_text())
    path.chmod(0)  # refused to any user but root: the test below also refuses it to root


SPECIAL = {
    "a-directory": _a_directory,
    "a-fifo": _a_fifo,
    "a-link-to-a-device": _a_link_to_a_device,
    "the-store-is-a-file": _a_file_in_place_of_the_store,
    "no-permission": _no_permission,
}


def special_store(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store in which the laptop's profile is ``SPECIAL[kind]``."""
    if kind in ("a-fifo", "a-link-to-a-device") and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on Windows, and links need privileges there")
    path = ProfileStore(tmp_path).path_for(fingerprint(snapshot(CPU_ONLY)))
    path.parent.mkdir(parents=True)
    SPECIAL[kind](path)
    if kind == "no-permission":
        real_open = os.open

        def refused(name: object, *args: object, **kwargs: object) -> int:
            if Path(str(name)) == path:
                raise PermissionError(13, "Permission denied", str(name))
            return real_open(name, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", refused)  # root reads every file: refuse it here too
    return path


def within_seconds(seconds: float, call: Callable[[], T]) -> T:
    """``call()`` in a thread, which must end within ``seconds`` (a FIFO opened for reading
    blocks until a writer comes)."""
    done: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            done.append(call())
        except BaseException as error:  # handed to the test thread
            errors.append(error)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s"
    if errors:
        raise errors[0]
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return done[0]


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_recommend_warns_when_the_stored_file_cannot_be_read(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recommend() never stops a training script over the store: an unreadable file, a
    directory, a FIFO or a device in a profile's place is a warning naming it, at once, in
    little memory, and the rules-only profile comes back."""
    path = special_store(tmp_path, kind, monkeypatch)
    tracemalloc.start()
    try:
        with pytest.warns(StoredProfileWarning) as caught:
            profile = within_seconds(10, lambda: on_the_laptop(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    assert profile.measured is False
    assert profile.device == "cpu"
    (warning,) = caught
    message = str(warning.message)
    assert str(path) in message
    assert "\n" not in message
    assert "delete it" in message or "--store DIR" in message


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_show_exits_4_when_the_stored_file_cannot_be_read(
    tmp_path: Path, snapshot_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = special_store(tmp_path, kind, monkeypatch)
    laptop = str(snapshot_path / f"{CPU_ONLY}.json")
    result = within_seconds(10, lambda: run("show", "--snapshot", laptop, "--store", str(tmp_path)))
    assert result.exit_code == EXIT_STORE, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("autotune: error: ")
    assert str(path) in line


# --- the command: exit 4, one line, nothing changed -------------------------------------------


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


@pytest.mark.parametrize(
    "command", [["show"], ["show", "--json"], ["export"], ["export", "-m", "conv"]]
)
@pytest.mark.parametrize("bad", ["not-utf8", "truncated", "another-machine"])
def test_commands_exit_4_with_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, snapshot_path: Path, command: list[str], bad: str
) -> None:
    content = BAD[bad]()
    path = laptop_store(tmp_path, content)
    result = run(
        *command, "--snapshot", str(snapshot_path / f"{CPU_ONLY}.json"), "--store", str(tmp_path)
    )
    assert result.exit_code == EXIT_STORE, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("autotune: error: ")
    assert str(path) in line
    assert "delete it" in line
    assert "Traceback" not in result.output
    assert path.read_bytes() == content


@pytest.mark.parametrize("command", [["report"], ["bench", "--rounds", "1"]])
def test_commands_on_this_machine_exit_4_too(
    tmp_path: Path, detected_as: Callable[[str], HardwareSnapshot], command: list[str]
) -> None:
    """report and bench read this machine's stored profile (detection faked: the laptop)."""
    detected_as(CPU_ONLY)
    path = laptop_store(tmp_path, BAD["another-machine"]())
    result = run(*command, "--store", str(tmp_path))
    assert result.exit_code == EXIT_STORE, result.output
    assert str(path) in result.stderr
    assert "Traceback" not in result.output


# --- the fuzz: random bytes and random mutations of a sound stored profile --------------------

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A sound stored profile with bytes flipped, cut, inserted or deleted."""
    data = bytearray(valid_text().encode())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if action == "flip":
            data[at] = draw(st.integers(0, 255))
        elif action == "cut":
            del data[at:]
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at : at + draw(st.integers(1, 64))]
        if not data:
            break
    return bytes(data)


@pytest.mark.slow  # a fuzz
@FUZZ
@given(content=st.one_of(st.binary(max_size=2048), mutated()))
def test_any_stored_bytes_give_this_machines_profile_or_a_warning(
    tmp_path: Path, content: bytes
) -> None:
    laptop_store(tmp_path, content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile = on_the_laptop(tmp_path)
    assert all(issubclass(w.category, StoredProfileWarning) for w in caught)
    assert profile.provenance.fingerprint == fingerprint(snapshot(CPU_ONLY))
    assert profile.device == "cpu"
    assert bool(caught) or profile == ProfileStore(tmp_path).load(profile.provenance.fingerprint)


# --- saving rules only over a file the store cannot read ------------------------------------------


def _measured_by_a_newer_release(data: dict[str, object]) -> None:
    data["schema_version"] = PROFILE_SCHEMA_VERSION + 1
    data["measured"] = True


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(lambda: edited(_measured_by_a_newer_release), id="newer-release"),
        pytest.param(BAD["truncated"], id="truncated"),
        pytest.param(BAD["not-utf8"], id="not-utf8"),
    ],
)
def test_rules_only_never_replaces_a_stored_file_it_cannot_read(
    tmp_path: Path, content: Callable[[], bytes]
) -> None:
    """A profile a newer release measured cannot be read here, and may be measured: saving a
    rules-only profile over it (``recommend --save``) is refused as over a measured one."""
    before = content()
    path = laptop_store(tmp_path, before)
    rules_only = build_profile(snapshot(CPU_ONLY), now=NOW)
    with pytest.raises(MeasuredProfileExistsError, match=r"cannot be read .*--force"):
        ProfileStore(tmp_path).save(rules_only)
    assert path.read_bytes() == before
    ProfileStore(tmp_path).save(rules_only, force=True)
    assert ProfileStore(tmp_path).load(fingerprint(snapshot(CPU_ONLY))) == rules_only


def test_recommend_save_keeps_a_profile_from_a_newer_release(
    tmp_path: Path, snapshot_path: Path, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    detected_as(CPU_ONLY)
    before = edited(_measured_by_a_newer_release)
    path = laptop_store(tmp_path, before)
    result = run("recommend", "--save", "--store", str(tmp_path))
    assert result.exit_code == EXIT_STORE, result.output
    (line,) = result.stderr.splitlines()
    assert str(path) in line
    assert "--force" in line
    assert path.read_bytes() == before


def test_a_store_that_is_a_file_is_reported_by_the_write(tmp_path: Path) -> None:
    """Nothing there to lose: the error is the write's, not 'may hold a measured one'."""
    store = tmp_path / "store"
    store.write_text("a file")
    with pytest.raises(StoreError, match=r"cannot write") as caught:
        ProfileStore(store).save(build_profile(snapshot(CPU_ONLY), now=NOW))
    assert not isinstance(caught.value, MeasuredProfileExistsError)


# --- a save that cannot complete changes nothing ------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _saved_twice(tmp_path: Path) -> tuple[ProfileStore, Profile, dict[str, Path]]:
    """A store holding a measured profile in its three files, a second profile to save over
    it, and the three files' paths by name."""
    store = ProfileStore(tmp_path)
    store.save(measured(CPU_ONLY, batch=64))
    fp = fingerprint(snapshot(CPU_ONLY))
    paths = {
        "machine": store.path_for(fp),
        "workload": store.path_for(fp, "conv"),
        "mode": store.path_of_mode(fp, "conv", "speed"),
    }
    assert all(path.is_file() for path in paths.values())
    return store, measured(CPU_ONLY, batch=128), paths


@pytest.mark.parametrize("where", ["machine", "workload", "mode"])
def test_a_directory_where_a_profile_goes_fails_the_save_before_anything_is_written(
    tmp_path: Path, where: str
) -> None:
    """The files were written one by one: a directory at the machine's file failed its
    rename after the workload's two files had been replaced, and the store disagreed with
    itself."""
    store, newer, paths = _saved_twice(tmp_path)
    paths[where].unlink()
    paths[where].mkdir()
    before = _files(tmp_path)
    with pytest.raises(StoreError) as caught:
        store.save(newer)
    assert f"cannot write {paths[where]}: it is a directory, not a file; delete it" in str(
        caught.value
    )
    assert _files(tmp_path) == before


def test_a_write_that_fails_midway_puts_back_what_the_save_had_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, newer, _paths = _saved_twice(tmp_path)
    before = _files(tmp_path)
    real = files.write_atomically
    calls: list[Path] = []

    def disk_full_at_the_second(path: Path, data: str | bytes, **kwargs: bool) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise StoreError(f"cannot write {path}: No space left on device")
        real(path, data, **kwargs)

    monkeypatch.setattr(files, "write_atomically", disk_full_at_the_second)
    with pytest.raises(StoreError, match="No space left on device"):
        store.save(newer)
    assert len(calls) == 3  # the first, the second that failed, the first put back
    assert _files(tmp_path) == before


def test_autotune_refuses_a_directory_in_place_of_its_profile_before_measuring(
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """'autotune show' told the user to run autotune, which replaces it: autotune measured,
    then could not write over the directory, and the measurement was lost."""

    def never(*_args: object, **_kwargs: object) -> Profile:
        raise AssertionError("measured before the store was checked")

    detected_as(CPU_ONLY)
    monkeypatch.setattr(api, "tune", never)
    path = ProfileStore(tmp_path).path_for(fingerprint(snapshot(CPU_ONLY)), "conv")
    path.mkdir(parents=True)
    shown = run("show", "-m", "conv", "--store", str(tmp_path))
    assert shown.exit_code == EXIT_STORE, shown.output
    assert "cannot be used or replaced: delete it, then" in shown.stderr
    assert "which replaces it" not in shown.stderr
    result = run("--budget", "30", "--store", str(tmp_path))
    assert result.exit_code == EXIT_STORE, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"autotune: error: cannot write {path}: it is a directory")
    assert path.is_dir()
