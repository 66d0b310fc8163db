"""Server status levels, the status file, the grace period and listeners (kestrel.status)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from kestrel.errors import ForbiddenStatus, KestrelError, UnknownStatus
from kestrel.status import (
    ServerStatus,
    Status,
    StatusChangeRejectedError,
    parse_settable_status,
    parse_status,
    write_status_file,
)


@pytest.fixture
def status_file(tmp_path: Path) -> Path:
    """A status file path in a fresh folder (the file does not exist yet)."""
    return tmp_path / "state" / "kestrel-status"


def make(clock: Clock, path: Path | None, default: Status | str = Status.UP,
         grace: float = 0.0) -> ServerStatus:
    return ServerStatus(clock, path, default, grace)


# -- levels ----------------------------------------------------------------------------------


def test_levels_follow_kestrel_table() -> None:
    """Strictness and what each level blocks are Kestrel's."""
    table = {
        Status.UP: (1, False, False, False),
        Status.WRITE_AVOID: (2, False, False, False),
        Status.READ_ONLY: (3, False, True, True),
        Status.QUIESCENT: (4, True, True, True),
        Status.DOWN: (100, True, True, False),
    }
    for status, (strictness, reads, writes, graceful) in table.items():
        assert (status.strictness, status.blocks_reads, status.blocks_writes,
                status.graceful_shutdown) == (strictness, reads, writes, graceful)
    assert Status.QUIESCENT.stricter_than(Status.READ_ONLY)
    assert not Status.READ_ONLY.stricter_than(Status.READ_ONLY)
    assert not Status.UP.stricter_than(Status.WRITE_AVOID)


def test_names() -> None:
    """Display names are Kestrel's; wire names are their upper case."""
    assert [s.display_name for s in Status] == ["Up", "WriteAvoid", "ReadOnly", "Quiescent",
                                                "Down"]
    assert [s.wire_name for s in Status] == ["UP", "WRITEAVOID", "READONLY", "QUIESCENT", "DOWN"]
    assert str(Status.READ_ONLY) == "ReadOnly"


@pytest.mark.parametrize("text, expected", [
    ("Up", Status.UP), ("up", Status.UP), ("DOWN", Status.DOWN), ("readOnly", Status.READ_ONLY),
    ("QuIeScEnT", Status.QUIESCENT), ("writeavoid", Status.WRITE_AVOID),
    ("ReadOnly\n", Status.READ_ONLY),
])
def test_parse_is_case_insensitive(text: str, expected: Status) -> None:
    """Names parse whatever their case (and a trailing newline is ignored)."""
    assert parse_status(text) is expected


@pytest.mark.parametrize("text", ["wut?", "", "read only", "write_avoid", None, b"up", 1])
def test_parse_rejects_unknown_names(text: object) -> None:
    """Anything else, None included, is UnknownStatus."""
    with pytest.raises(UnknownStatus):
        parse_status(text)  # type: ignore[arg-type]


def test_down_is_forbidden_to_set() -> None:
    """Down parses, but may not be set: ForbiddenStatus."""
    with pytest.raises(ForbiddenStatus):
        parse_settable_status("down")
    with pytest.raises(ForbiddenStatus):
        parse_settable_status(Status.DOWN)
    assert parse_settable_status("Quiescent") is Status.QUIESCENT


# -- loading ---------------------------------------------------------------------------------


def test_missing_file_gives_default_and_writes_nothing(clock: Clock, status_file: Path) -> None:
    """Without a status file the default applies, and starting up does not create one."""
    s = make(clock, status_file, "quiescent")
    assert s.status is Status.QUIESCENT and s.enforced is Status.QUIESCENT
    assert s.blocks_reads and s.blocks_writes
    assert not status_file.exists()


def test_stored_status_applies_at_once_without_grace(clock: Clock, status_file: Path) -> None:
    """A parsable stored status is reported and enforced immediately, whatever the grace period."""
    write_status_file(status_file, Status.READ_ONLY)
    s = make(clock, status_file, Status.UP, grace=30)
    assert s.status is Status.READ_ONLY
    assert s.enforced is Status.READ_ONLY
    assert s.blocks_writes and not s.blocks_reads
    assert not s.change_pending


def test_stored_status_is_read_from_the_first_line_case_insensitively(
        clock: Clock, status_file: Path) -> None:
    """Only the first line counts, in any case."""
    status_file.parent.mkdir(parents=True)
    status_file.write_text("writeAVOID\nUp\n", encoding="utf-8")
    assert make(clock, status_file).status is Status.WRITE_AVOID


@pytest.mark.parametrize("content", [b"", b"sideways\n", b"\xff\xfe\n", b"\nUp\n"])
def test_unusable_file_gives_default_and_logs(clock: Clock, status_file: Path,
                                              content: bytes) -> None:
    """An empty, unparsable or undecodable file leaves the default, with an error logged."""
    status_file.parent.mkdir(parents=True)
    status_file.write_bytes(content)
    with capturedLogs() as events:
        s = make(clock, status_file, "writeavoid")
    assert s.status is Status.WRITE_AVOID
    assert any(e["log_level"].name == "error" for e in events)


def test_unreadable_file_gives_default(clock: Clock, tmp_path: Path) -> None:
    """A status file path that is a folder is unreadable: the default applies."""
    assert make(clock, tmp_path, "readonly").status is Status.READ_ONLY


def test_forbidden_default_is_refused(clock: Clock, status_file: Path) -> None:
    """Down cannot be the default status."""
    with pytest.raises(ForbiddenStatus):
        make(clock, status_file, "down")


# -- changes and the status file -------------------------------------------------------------


def test_change_is_persisted_as_name_and_newline(clock: Clock, status_file: Path) -> None:
    """An accepted change rewrites the file with the display name and a newline, nothing else."""
    s = make(clock, status_file)
    assert s.set_status("READONLY") is Status.READ_ONLY
    assert status_file.read_bytes() == b"ReadOnly\n"
    s.set_status("writeavoid")
    assert status_file.read_bytes() == b"WriteAvoid\n"
    assert sorted(os.listdir(status_file.parent)) == ["kestrel-status"]


def test_persisted_status_survives_a_restart(clock: Clock, status_file: Path) -> None:
    """A new ServerStatus on the same file starts in the last status set."""
    make(clock, status_file).set_status("quiescent")
    again = make(Clock(), status_file)
    assert again.status is Status.QUIESCENT and again.blocks_reads


def test_memory_only_status(clock: Clock, tmp_path: Path) -> None:
    """With no status file, changes work and nothing is written."""
    s = make(clock, None)
    s.set_status("readonly")
    assert s.status is Status.READ_ONLY and s.blocks_writes
    assert list(tmp_path.iterdir()) == []


def test_looser_and_stricter_changes_without_grace_apply_at_once(
        clock: Clock, status_file: Path) -> None:
    """With no grace period every accepted change is enforced immediately."""
    s = make(clock, status_file)
    s.set_status("quiescent")
    assert s.blocks_reads and s.blocks_writes
    s.set_status("readonly")
    assert not s.blocks_reads and s.blocks_writes
    s.set_status("up")
    assert not s.blocks_reads and not s.blocks_writes
    assert clock.getDelayedCalls() == []


@pytest.mark.parametrize("name, error", [("down", ForbiddenStatus), ("bogus", UnknownStatus),
                                         ("", UnknownStatus)])
def test_bad_requests_change_nothing(clock: Clock, status_file: Path, name: str,
                                     error: type[Exception]) -> None:
    """Down and unknown names raise, leaving status and file as they were."""
    s = make(clock, status_file)
    s.set_status("writeavoid")
    with pytest.raises(error):
        s.set_status(name)
    assert s.status is Status.WRITE_AVOID
    assert status_file.read_bytes() == b"WriteAvoid\n"


def test_stricter_change_is_reported_at_once_and_enforced_after_grace(
        clock: Clock, status_file: Path) -> None:
    """Up -> ReadOnly with 30 s grace: reported and persisted now, writes blocked after 30 s."""
    s = make(clock, status_file, grace=30)
    assert s.set_status("readonly") is Status.READ_ONLY
    assert s.status is Status.READ_ONLY
    assert status_file.read_bytes() == b"ReadOnly\n"
    assert s.change_pending and s.enforced is Status.UP and not s.blocks_writes
    assert s.writeable == 0.0  # gauges follow the reported status
    clock.advance(29.999)
    assert not s.blocks_writes
    clock.advance(0.001)
    assert s.blocks_writes and s.enforced is Status.READ_ONLY and not s.change_pending


@pytest.mark.parametrize("second", ["quiescent", "readonly", "READONLY"])
def test_stricter_or_equal_change_while_pending_is_rejected(
        clock: Clock, status_file: Path, second: str) -> None:
    """While a stricter change waits, another stricter-or-equal one raises and changes nothing."""
    s = make(clock, status_file, grace=30)
    s.set_status("readonly")
    clock.advance(10)
    with pytest.raises(StatusChangeRejectedError) as e:
        s.set_status(second)
    assert isinstance(e.value, KestrelError)
    assert e.value.current is Status.READ_ONLY
    assert "grace period" in str(e.value)
    assert s.status is Status.READ_ONLY and s.enforced is Status.UP
    assert status_file.read_bytes() == b"ReadOnly\n"
    clock.advance(20)  # the original timer still fires on time
    assert s.enforced is Status.READ_ONLY


def test_looser_change_while_pending_applies_at_once_and_cancels_timer(
        clock: Clock, status_file: Path) -> None:
    """Up -> Quiescent (pending) -> WriteAvoid: WriteAvoid enforced now, Quiescent never."""
    s = make(clock, status_file, grace=30)
    s.set_status("quiescent")
    s.set_status("writeavoid")
    assert s.status is Status.WRITE_AVOID and s.enforced is Status.WRITE_AVOID
    assert not s.change_pending and clock.getDelayedCalls() == []
    clock.advance(60)
    assert s.enforced is Status.WRITE_AVOID and not s.blocks_reads
    assert status_file.read_bytes() == b"WriteAvoid\n"


def test_stricter_change_accepted_again_after_grace(clock: Clock, status_file: Path) -> None:
    """Once the grace period is over, a further stricter change starts a new one."""
    s = make(clock, status_file, grace=5)
    s.set_status("writeavoid")
    clock.advance(5)
    s.set_status("quiescent")
    assert s.change_pending and not s.blocks_reads
    clock.advance(5)
    assert s.blocks_reads


def test_equal_change_without_pending_is_accepted(clock: Clock, status_file: Path) -> None:
    """Setting the current status again is accepted (and persisted) when nothing is pending."""
    s = make(clock, status_file, "readonly")
    assert s.set_status("readonly") is Status.READ_ONLY
    assert status_file.read_bytes() == b"ReadOnly\n"


# -- listeners -------------------------------------------------------------------------------


def test_listener_called_before_stricter_and_after_looser_change(
        clock: Clock, status_file: Path) -> None:
    """A stricter change is announced before it is accepted, a looser one after."""
    s = make(clock, status_file)
    seen: list[tuple[Status, Status, Status, str | None]] = []

    def listener(old: Status, new: Status) -> None:
        stored = status_file.read_text() if status_file.exists() else None
        seen.append((old, new, s.status, stored))

    s.add_listener(listener)
    s.set_status("readonly")
    s.set_status("up")
    assert seen == [
        (Status.UP, Status.READ_ONLY, Status.UP, None),            # before: not yet accepted
        (Status.READ_ONLY, Status.UP, Status.UP, "ReadOnly\n"),    # after: accepted, not stored
    ]


def test_equal_change_does_not_call_listeners(clock: Clock, status_file: Path) -> None:
    """No change of status, no call."""
    s = make(clock, status_file)
    calls: list[tuple[Status, Status]] = []
    s.add_listener(lambda old, new: calls.append((old, new)))
    s.set_status("up")
    assert calls == []


def test_removed_listener_is_not_called(clock: Clock, status_file: Path) -> None:
    """remove_listener stops the calls."""
    s = make(clock, status_file)
    calls: list[tuple[Status, Status]] = []

    def listener(old: Status, new: Status) -> None:
        calls.append((old, new))

    s.add_listener(listener)
    s.remove_listener(listener)
    s.set_status("readonly")
    assert calls == []


class ZooKeeperDownError(Exception):
    """Stands for a failing ZooKeeper update."""


def test_failing_listener_on_stricter_change_leaves_everything(
        clock: Clock, status_file: Path) -> None:
    """A refusing listener stops a stricter change: old status, no file, no timer; error raised."""
    s = make(clock, status_file, grace=30)
    undone: list[tuple[Status, Status]] = []
    s.add_listener(lambda old, new: undone.append((old, new)))

    def refuse(old: Status, new: Status) -> None:
        raise ZooKeeperDownError()

    s.add_listener(refuse)
    with capturedLogs(), pytest.raises(ZooKeeperDownError):
        s.set_status("readonly")
    assert s.status is Status.UP and s.enforced is Status.UP
    assert not status_file.exists()
    assert not s.change_pending and clock.getDelayedCalls() == []
    # the listener that had accepted the change is told it was undone
    assert undone == [(Status.UP, Status.READ_ONLY), (Status.READ_ONLY, Status.UP)]


def test_failing_listener_on_looser_change_restores_previous_state(
        clock: Clock, status_file: Path) -> None:
    """A refusing listener undoes a looser change: status, file and pending timer are kept."""
    s = make(clock, status_file, grace=30)
    s.set_status("readonly")
    fail = [True]

    def refuse(old: Status, new: Status) -> None:
        if fail[0]:
            raise ZooKeeperDownError()

    s.add_listener(refuse)
    with capturedLogs(), pytest.raises(ZooKeeperDownError):
        s.set_status("up")
    assert s.status is Status.READ_ONLY and s.enforced is Status.UP and s.change_pending
    assert status_file.read_bytes() == b"ReadOnly\n"
    clock.advance(30)
    assert s.enforced is Status.READ_ONLY
    fail[0] = False
    s.set_status("up")
    assert s.status is Status.UP and status_file.read_bytes() == b"Up\n"


def test_failed_write_restores_status_and_undoes_listeners(clock: Clock, tmp_path: Path) -> None:
    """If the status file cannot be written the change is undone and the OSError raised."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    s = make(clock, blocker / "status")
    calls: list[tuple[Status, Status]] = []
    s.add_listener(lambda old, new: calls.append((old, new)))
    with capturedLogs(), pytest.raises(OSError):
        s.set_status("quiescent")
    assert s.status is Status.UP and s.enforced is Status.UP
    assert calls == [(Status.UP, Status.QUIESCENT), (Status.QUIESCENT, Status.UP)]


# -- shutdown --------------------------------------------------------------------------------


def test_shutdown_goes_down_without_persisting(clock: Clock, status_file: Path) -> None:
    """shutdown() reports and enforces Down at once, cancels the grace timer, keeps the file."""
    s = make(clock, status_file, grace=30)
    s.set_status("readonly")
    calls: list[tuple[Status, Status]] = []
    s.add_listener(lambda old, new: calls.append((old, new)))
    s.shutdown()
    assert s.status is Status.DOWN and s.enforced is Status.DOWN
    assert s.blocks_reads and s.blocks_writes and not s.graceful_shutdown
    assert clock.getDelayedCalls() == []
    assert status_file.read_bytes() == b"ReadOnly\n"
    assert calls == [(Status.READ_ONLY, Status.DOWN)]
    s.shutdown()
    assert calls == [(Status.READ_ONLY, Status.DOWN)]


def test_shutdown_survives_failing_listener(clock: Clock, status_file: Path) -> None:
    """A listener failing during shutdown is logged; the server still goes Down."""
    s = make(clock, status_file)

    def refuse(old: Status, new: Status) -> None:
        raise ZooKeeperDownError()

    s.add_listener(refuse)
    with capturedLogs() as events:
        s.shutdown()
    assert s.status is Status.DOWN
    assert any(e.get("log_failure") is not None for e in events)


def test_a_looser_change_after_shutdown_is_possible(clock: Clock, status_file: Path) -> None:
    """Down is the strictest level, so any settable status is looser than it."""
    s = make(clock, status_file)
    s.shutdown()
    s.set_status("quiescent")
    assert s.status is Status.QUIESCENT


def test_gauges_follow_reported_status(clock: Clock) -> None:
    """readable/writeable are 1.0 or 0.0 from the reported status."""
    s = make(clock, None)
    assert (s.readable, s.writeable) == (1.0, 1.0)
    s.set_status("readonly")
    assert (s.readable, s.writeable) == (1.0, 0.0)
    s.set_status("quiescent")
    assert (s.readable, s.writeable) == (0.0, 0.0)


def test_graceful_shutdown_follows_enforced_status(clock: Clock) -> None:
    """ReadOnly and Quiescent ask for a graceful close once enforced."""
    s = make(clock, None, grace=1)
    s.set_status("readonly")
    assert not s.graceful_shutdown
    clock.advance(1)
    assert s.graceful_shutdown


def test_negative_grace_period_is_refused(clock: Clock) -> None:
    """A negative grace period is a programming error."""
    with pytest.raises(ValueError):
        make(clock, None, grace=-1)


# -- the file writer -------------------------------------------------------------------------


def test_write_status_file_replaces_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    """The writer creates parents, replaces the previous content whole, and cleans up."""
    path = tmp_path / "a" / "b" / "status"
    write_status_file(path, Status.QUIESCENT)
    write_status_file(path, Status.UP)
    assert path.read_bytes() == b"Up\n"
    assert os.listdir(path.parent) == ["status"]
