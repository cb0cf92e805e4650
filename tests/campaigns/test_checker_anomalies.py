"""Each named anomaly of the checker, from a hand-built log and a real workspace that
exhibit it (checker_scenes.py); and the consistent run that exhibits none."""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from pathlib import Path

from checker_scenes import (
    B1,
    B3,
    F0,
    F0_WRITTEN,
    JOURNAL,
    E,
    W,
    append,
    dump,
    names,
    scene,
    scripted,
)

from durable_spaces.campaigns.checker import merge
from durable_spaces.campaigns.checks.inputs import LaunchRecord, Proc, ProcessListing
from durable_spaces.campaigns.checks.processes import leftovers


def _only(anomalies: list[dict], name: str) -> dict:
    found = [a for a in anomalies if a["name"] == name]
    assert len(found) == 1, dump(anomalies)
    return found[0]


# --- the negative ------------------------------------------------------------------------


def test_a_consistent_run_reports_no_anomaly(tmp_path: Path) -> None:
    s = scene(tmp_path, transactional=True)
    v = s.verdicts()
    bad = {k: x for k, x in v.items() if x["valid"] is not True and k != "same_as_uninterrupted"}
    assert not bad, dump(bad)
    assert all(x["anomalies"] == [] for x in v.values()), dump(v)
    assert v["same_as_uninterrupted"]["valid"] is None  # no workload given: cannot replay


def test_a_scripted_run_with_an_interrupted_step_reports_no_anomaly(tmp_path: Path) -> None:
    s = scripted(tmp_path, "ck-1", 8, interrupted=frozenset({2, 5}))
    v = s.verdicts()
    assert merge(v) is True, dump(v)
    assert "(2 interrupted)" in v["same_as_uninterrupted"]["detail"]


# --- effects -----------------------------------------------------------------------------


def test_lost_effect_of_an_append(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "journal.txt").write_text("s3-dddddddd\n")
    a = _only(s.anomalies("exactly_once"), "lost_effect")
    assert a["path"] == "journal.txt" and a["witness"] == [B1]
    assert s.verdicts()["workspace_equals_log"]["valid"] is False


def test_lost_effect_file_as_before_later_calls(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "journal.txt").write_text("s1-bbbbbbbb\n")  # as after B1: B3 lost
    a = _only(s.anomalies("workspace_equals_log"), "lost_effect")
    assert a["path"] == "journal.txt" and a["witness"] == [B3]


def test_lost_effect_missing_file(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "f0.txt").unlink()
    a = _only(s.anomalies("exactly_once"), "lost_effect")
    assert a["path"] == "f0.txt" and a["witness"] == [W, E]


def test_duplicate_effect_append_twice(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "journal.txt").write_text("s1-bbbbbbbb\ns1-bbbbbbbb\ns3-dddddddd\n")
    a = _only(s.anomalies("exactly_once"), "duplicate_effect")
    assert a["path"] == "journal.txt" and a["witness"] == [B1]


def test_duplicate_effect_edit_applied_twice(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "f0.txt").write_text("s0-aaaaaaaa-0\ns0-aaaaaaaa-1\ns2-cccccccc-e\ns2-cccccccc-e\n")
    a = _only(s.anomalies("exactly_once"), "duplicate_effect")
    assert a["path"] == "f0.txt" and a["witness"] == [E]


def test_duplicate_effect_write_reapplied_after_a_later_edit(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "f0.txt").write_text(F0_WRITTEN)  # the write's content, after E changed it
    a = _only(s.anomalies("exactly_once"), "duplicate_effect")
    assert a["path"] == "f0.txt" and a["witness"] == [W, E]


def test_uncommitted_effect_of_an_interrupted_call(tmp_path: Path) -> None:
    s = scene(tmp_path, finish=False)
    s.t.call("call-s4-eeeeeeee", "bash", append("s4-eeeeeeee"), status="interrupted")
    s.t.done()
    (s.root / "journal.txt").write_text(JOURNAL + "s4-eeeeeeee\n")
    a = _only(s.anomalies("exactly_once"), "uncommitted_effect")
    assert a["witness"] == ["call-s4-eeeeeeee"] and "interrupted" in a["detail"]


def test_reordered_effect(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "journal.txt").write_text("s3-dddddddd\ns1-bbbbbbbb\n")
    a = _only(s.anomalies("exactly_once"), "reordered_effect")
    assert set(a["witness"]) == {B1, B3}


def test_phantom_files_dirs_specials_and_temporaries(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "notes.txt").write_text("hello\n")
    (s.root / "empty").mkdir()
    os.mkfifo(s.root / "pipe")
    (s.root / ".ds-tmp-0123456789ab").write_text(F0)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(s.root / "sock"))
        found = s.anomalies("workspace_equals_log")
    assert sorted(a["path"] for a in found) == [
        ".ds-tmp-0123456789ab", "empty", "notes.txt", "pipe", "sock",
    ]  # fmt: skip
    assert set(names(found)) == {"phantom_file"}
    tmp = next(a for a in found if a["path"].startswith(".ds-tmp"))
    assert "temporary of the adapter" in tmp["detail"] and tmp["witness"] == [W, E]
    assert s.verdicts()["exactly_once"]["valid"] is True  # no effect applied twice or lost


def test_torn_file_prefix_and_zero_filled(tmp_path: Path) -> None:
    s = scene(tmp_path)
    (s.root / "journal.txt").write_bytes(JOURNAL.encode()[:15])
    a = _only(s.anomalies("workspace_equals_log"), "torn_file")
    assert a["path"] == "journal.txt" and a["witness"] == [B3]
    data = F0.encode()
    (s.root / "f0.txt").write_bytes(data[:20] + b"\0" * (len(data) - 20))
    torn = [a for a in s.anomalies("workspace_equals_log") if a["name"] == "torn_file"]
    assert {a["path"] for a in torn} == {"journal.txt", "f0.txt"}


# --- epochs, launches, stale writes -------------------------------------------------------


def test_stale_commit(tmp_path: Path) -> None:
    s = scene(tmp_path, finish=False)
    high = s.t.call("call-s4-eeeeeeee", "bash", append("s4-eeeeeeee"), epoch=2)
    stale = s.t.commit([{"op": "task", "id": "t9", "state": "running"}], epoch=1, stale=True)
    s.launches = [LaunchRecord(1, pid=100), LaunchRecord(2, pid=101)]
    a = _only(s.anomalies("no_stale_writes"), "stale_commit")
    assert a["witness"] == [high - 1, stale]  # the first commit of epoch 2, then the stale one


def _sql(log: Path, statement: str) -> None:
    """Damage the stored log the way no adapter code path would."""
    with sqlite3.connect(log) as db:
        db.execute(statement)


def test_fence_below_commit(tmp_path: Path) -> None:
    s = scene(tmp_path)
    s.t.close()
    _sql(s.log, "UPDATE cua_fence SET floor = 0")
    a = _only(s.anomalies("no_stale_writes"), "fence_below_commit")
    assert a["witness"] == [1]


def test_two_drivers_one_epoch(tmp_path: Path) -> None:
    s = scene(tmp_path)
    s.launches = [LaunchRecord(1, pid=100), LaunchRecord(1, pid=200)]
    a = _only(s.anomalies("no_stale_writes"), "two_drivers_one_epoch")
    assert "100" in a["detail"] and "200" in a["detail"] and a["witness"][0] == 1


def test_a_commit_by_an_epoch_never_issued(tmp_path: Path) -> None:
    s = scene(tmp_path, finish=False)
    seq = s.t.commit([{"op": "task", "id": "t9", "state": "done"}], epoch=3)
    a = _only(s.anomalies("no_stale_writes"), "two_drivers_one_epoch")
    assert a["witness"] == [seq] and "epoch 3" in a["detail"]


def test_stale_write_after_the_last_commit(tmp_path: Path) -> None:
    s = scene(tmp_path)
    time.sleep(0.1)
    (s.root / "journal.txt").write_text(JOURNAL)  # same bytes, written after the end
    last = len(s.inputs().log.commits)
    a = _only(s.anomalies("no_stale_writes"), "stale_write")
    assert a["path"] == "journal.txt" and a["witness"] == [last]
    assert s.verdicts()["workspace_equals_log"]["valid"] is True  # only the time shows it
    s.host_clock = False  # a guest clock (microvm): not comparable, not checked
    v = s.verdicts()["no_stale_writes"]
    assert v["valid"] is True and "not checked" in v["detail"]


def test_stale_write_bounded_by_the_done_event(tmp_path: Path) -> None:
    s = scene(tmp_path)
    s.t.close()
    done = time.time() * 1000  # the last driver's done event, after its last commit
    time.sleep(0.1)
    (s.root / "f0.txt").write_text(F0)  # a stale writer, after the end
    time.sleep(0.1)
    _sql(s.log, "UPDATE cua_fence SET floor = 2")  # the log written again, no commit
    s.launches = [LaunchRecord(1, pid=100)]
    assert s.verdicts()["no_stale_writes"]["valid"] is True  # the log's mtime is too late
    s.launches = [LaunchRecord(1, pid=100, done_ms=done)]
    a = _only(s.anomalies("no_stale_writes"), "stale_write")
    assert a["path"] == "f0.txt" and "done event" in a["detail"]


# --- image, replay, processes, the rest ---------------------------------------------------


def test_log_image_mismatch_mode_content_and_symlink(tmp_path: Path) -> None:
    s = scene(tmp_path, transactional=True)
    os.chmod(s.root / "f0.txt", 0o600)
    (s.root / "link").symlink_to("f0.txt")
    found = s.anomalies("image_equals_workspace")
    assert {(a["path"], a["name"]) for a in found} == {
        ("f0.txt", "log_image_mismatch"), ("link", "log_image_mismatch"),
    }  # fmt: skip
    assert "mode 600" in next(a for a in found if a["path"] == "f0.txt")["detail"]
    (s.root / "journal.txt").write_text(JOURNAL + "x\n")
    assert any(
        a["path"] == "journal.txt" and "sha256" in a["detail"]
        for a in s.anomalies("image_equals_workspace")
    )


def test_a_call_missing_from_its_own_image_is_named_though_the_end_agrees(
    tmp_path: Path,
) -> None:
    """B1's end scan missed its own append (a journal that answered from what it knew):
    its result's image holds the file as before it; B3's start folded the line in, so the
    image at the end equals the workspace. Only ``image_follows_calls`` sees it."""
    before_b1 = {"f0.txt": F0_WRITTEN}  # no journal.txt yet
    s = scene(tmp_path, transactional=True, images={B1: before_b1})
    v = s.verdicts()
    assert v["image_equals_workspace"]["valid"] is True, dump(v["image_equals_workspace"])
    a = _only(s.anomalies("image_follows_calls"), "call_not_in_image")
    assert a["path"] == "journal.txt" and a["witness"][0] == B1
    assert "holds no file" in a["detail"]
    stale = {"f0.txt": F0, "journal.txt": "s1-bbbbbbbb\n"}  # B3's append missing
    s2 = scene(tmp_path / "b3", transactional=True, images={B3: stale})
    b = [a for a in s2.anomalies("image_follows_calls") if a["name"] == "call_not_in_image"]
    assert [(x["path"], x["witness"][0]) for x in b] == [("journal.txt", B3)]
    assert "sha256" in b[0]["detail"]


def test_a_call_missing_from_its_own_checkpoint_is_named_though_the_end_agrees(
    tmp_path: Path,
) -> None:
    """Checkpoint mode's blind spot: B1's checkpoint missed its own append (a
    listing that trusted a stale look); B3's checkpoint looked again and holds it, so the
    last checkpoint equals the workspace. Only ``checkpoint_follows_calls`` sees it: a
    crash of B3 restoring B1's checkpoint would have lost the line."""
    ok = scene(tmp_path / "ok", checkpoint=True)
    v = ok.verdicts()
    assert v["checkpoint_follows_calls"]["valid"] is True, dump(v["checkpoint_follows_calls"])
    assert v["checkpoint_follows_calls"]["detail"].startswith("4 committed calls"), dump(v)
    assert v["checkpoint_equals_workspace"]["valid"] is True, dump(v)
    before_b1 = {"f0.txt": F0_WRITTEN}  # no journal.txt yet
    s = scene(tmp_path / "b1", checkpoint=True, images={B1: before_b1})
    v = s.verdicts()
    assert v["checkpoint_equals_workspace"]["valid"] is True, dump(v["checkpoint_equals_workspace"])
    a = _only(s.anomalies("checkpoint_follows_calls"), "call_not_in_checkpoint")
    assert a["path"] == "journal.txt" and a["witness"][0] == B1 and "holds no file" in a["detail"]
    stale = {"f0.txt": F0_WRITTEN, "journal.txt": "s1-bbbbbbbb\n"}  # E's edit missing
    s2 = scene(tmp_path / "e", checkpoint=True, images={E: stale})
    b = _only(s2.anomalies("checkpoint_follows_calls"), "call_not_in_checkpoint")
    assert (b["path"], b["witness"][0]) == ("f0.txt", E) and "sha256" in b["detail"]
    s3 = scene(tmp_path / "gone", checkpoint=True)
    assert s3.manifests is not None
    cid = next(iter(s3.manifests.data))
    del s3.manifests.data[cid]  # type: ignore[attr-defined]
    c = _only(s3.anomalies("checkpoint_follows_calls"), "call_not_in_checkpoint")
    assert c["witness"][0] == W and "could not be read" in c["detail"]


def test_unexpected_call(tmp_path: Path) -> None:
    s = scripted(tmp_path, "ck-2", 4)
    tampered = "call-s9-99999999"
    seq = s.t.call(tampered, "bash", append("s9-99999999"), status=None)
    a = _only(s.anomalies("same_as_uninterrupted"), "unexpected_call")
    assert a["witness"] == [tampered, seq] and "after the script's 4 steps" in a["detail"]


def test_unexpected_call_with_other_arguments(tmp_path: Path) -> None:
    s = scene(tmp_path)
    from durable_spaces.campaigns.checks.inputs import Workload

    s.workload = Workload("ck-3", 4)  # not the script that made these calls
    found = s.anomalies("same_as_uninterrupted")
    assert names(found) == ["unexpected_call"] * 4
    assert found[0]["witness"][0] == W


def test_resurrected_process_and_the_servers_exemption() -> None:
    listing = ProcessListing(
        "namespace",
        (
            Proc(1, 0, "/bin/cua-spacesd serve"),
            Proc(5, 1, "/bin/cua-spacesd fs-as --user cua"),  # the daemon's own helper
            Proc(7, 1, "sh -c probe"),
            Proc(8, 7, "cat /proc/9/stat"),
            Proc(20, 1, "sh -c echo $$ > /tmp/ds-server.pid; while :; do ...; done"),
            Proc(21, 20, "sleep 0.2"),
            Proc(30, 1, "sleep 60"),
        ),
        probe=7,
        server_pid=20,
    )
    assert [p.pid for p in leftovers(listing, server=True)] == [30]
    assert [p.pid for p in leftovers(listing, server=False)] == [20, 21, 30]


def test_error_result_and_unfinished(tmp_path: Path) -> None:
    s = scene(tmp_path, finish=False)
    seq = s.t.call("call-s4-eeeeeeee", "bash", append("s4-eeeeeeee"), status="error")
    v = s.verdicts()
    assert v["no_error_results"]["anomalies"][0]["witness"] == ["call-s4-eeeeeeee", seq]
    assert names(v["finished"]["anomalies"]) == ["unfinished"]


def test_missing_commit(tmp_path: Path) -> None:
    s = scene(tmp_path)
    s.t.close()
    _sql(s.log, "DELETE FROM cua_commits WHERE seq = 4")
    a = _only(s.anomalies("log_intact"), "missing_commit")
    assert a["witness"] == [3, 5]
