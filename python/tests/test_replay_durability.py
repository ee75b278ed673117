"""What a replay buffer keeps across kill -9 when no call comes: groups sealed before a quiet
spell are written by its flusher thread within ``flush_interval_s`` (they had waited for the
next call, and a crash lost them however long ago they were sealed)."""

import os
import signal
import subprocess
import sys
import time
import textwrap

from rollout_buffer.replay import ReplayBuffer

CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from rollout_buffer.replay import ReplayBuffer, RolloutRecord
    buf = ReplayBuffer(sys.argv[1], target_group_size=4, flush_interval_s=0.2)
    out = buf.add_rollouts([
        RolloutRecord(environment="math", example_id="q0", policy_version="1",
                      rollout_uid=f"u{i}", reward=float(i),
                      output_tokens=np.arange(3, dtype=np.int32) + i)
        for i in range(4)
    ])
    print(",".join(out), flush=True)
    time.sleep(600)  # idle: no call comes until the kill
    """
)


def data_files(root):
    return [
        f for _, _, files in os.walk(os.path.join(root, "rollouts")) for f in files
        if f.endswith(".parquet")
    ]


def test_a_group_sealed_before_an_idle_spell_survives_kill_9(tmp_path):
    root = str(tmp_path / "replay")
    child = subprocess.Popen([sys.executable, "-c", CHILD, root], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "pending,pending,pending,sealed"
        # The flusher writes it about 0.2 s after the seal; the deadline only bounds a
        # failure.
        deadline = time.monotonic() + 60
        while not data_files(root) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert data_files(root), "the sealed group was never written while the buffer sat idle"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    buf = ReplayBuffer(root, target_group_size=4)
    assert buf.stats()["groups_live"] == 1
    [group] = buf.get_groups(buf.sample_groups(1).group_ids)
    assert sorted(r.rollout_uid for r in group.rollouts) == ["u0", "u1", "u2", "u3"]
    buf.close()


def test_the_flusher_takes_turns_with_calls_and_stops_at_close(tmp_path):
    buf = ReplayBuffer(str(tmp_path / "replay"), target_group_size=1, min_group_size=1,
                       flush_interval_s=0.01)
    from rollout_buffer.replay import RolloutRecord
    import numpy as np

    for i in range(200):
        buf.add_rollouts([RolloutRecord(environment="m", example_id=f"q{i}", policy_version="1",
                                        rollout_uid=f"u{i}", output_tokens=np.arange(2, dtype=np.int32))])
    flusher = buf._flusher
    assert flusher is not None and flusher.is_alive()
    # Written by the flusher, before close() would write them: every group, in time.
    root = str(tmp_path / "replay")
    deadline = time.monotonic() + 60
    while buf.stats()["groups_written"] < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert buf.stats()["groups_written"] == 200 and data_files(root)
    buf.close()
    flusher.join(timeout=60)
    assert not flusher.is_alive()
    again = ReplayBuffer(str(tmp_path / "replay"), target_group_size=1, min_group_size=1)
    assert again.stats()["groups_live"] == 200
    again.close()


def test_one_buffer_per_folder(tmp_path):
    """Two buffers on one folder each served the same groups, and overwrote each other's
    control log; the second is now refused, naming the holder, until the first closes or
    is dropped (as its process dying lets go)."""
    import gc

    import pytest

    root = str(tmp_path / "replay")
    first = ReplayBuffer(root, target_group_size=1, min_group_size=1, flush_interval_s=5.0)
    with pytest.raises(RuntimeError, match=f"another ReplayBuffer has .* open \\(pid {os.getpid()}\\)"):
        ReplayBuffer(root)
    first.close()
    second = ReplayBuffer(root, target_group_size=1, min_group_size=1, flush_interval_s=5.0)
    from rollout_buffer.replay import RolloutRecord

    second.add_rollouts([RolloutRecord(environment="m", example_id="q", policy_version="1", rollout_uid="u")])
    flusher = second._flusher
    del second  # dropped without close: a crash, in-process
    gc.collect()
    flusher.join(timeout=180)
    assert not flusher.is_alive(), "the flusher of a dropped buffer ends"
    third = ReplayBuffer(root)
    third.close()


def test_a_failed_open_lets_go_of_the_folder(tmp_path):
    """The folder's lock was taken before the control log was read: an open that failed
    there kept it while its traceback lived, and a retry was told another buffer held it."""
    import glob

    import pytest

    root = str(tmp_path / "replay")
    ReplayBuffer(root).close()
    [snapshot] = glob.glob(os.path.join(root, "control", "snapshot-*.json"))
    good = open(snapshot, "rb").read()
    open(snapshot, "wb").write(b"{not json")
    with pytest.raises(Exception) as first:
        ReplayBuffer(root)
    assert "another ReplayBuffer" not in str(first.value)
    with pytest.raises(Exception) as again:  # the first traceback still alive
        ReplayBuffer(root)
    assert type(again.value) is type(first.value), again.value
    open(snapshot, "wb").write(good)
    ReplayBuffer(root).close()


def test_accepted_versions_may_be_any_iterable(tmp_path):
    """A generator was read twice (checked, then used): the second read was empty and
    every rollout was refused."""
    from rollout_buffer.replay import RolloutRecord

    with ReplayBuffer(str(tmp_path / "r"), target_group_size=1, min_group_size=1,
                      accept_policy_versions=(v for v in [1, 2])) as buf:
        out = buf.add_rollouts([RolloutRecord(environment="m", example_id="q", policy_version="2",
                                              rollout_uid="u")])
        assert out == ["sealed"]


def test_snapshots_stay_the_size_of_the_live_state_and_exits_come_back(tmp_path, monkeypatch):
    """Every consumed group's id went into every snapshot: after 8,000 groups one was
    ~700 KB, rewritten every 256 control writes. Exits now go to files of their own,
    each written once; a restart still knows every group that left, so none is served
    again, and a snapshot written before that (with the exits inside) still opens."""
    import glob
    import json

    import numpy as np

    from rollout_buffer.replay import RolloutRecord
    from rollout_buffer.replay import buffer as replay_buffer

    monkeypatch.setattr(replay_buffer, "SNAPSHOT_EVERY", 8)
    root = str(tmp_path / "replay")

    def group(i):
        return [RolloutRecord(environment="m", example_id=f"q{i}", policy_version="1",
                              rollout_uid=f"u{i}-{j}", reward=float(j),
                              output_tokens=np.arange(2, dtype=np.int32))
                for j in range(2)]

    buf = ReplayBuffer(root, target_group_size=2, max_uses_per_group=1, durable=False)
    for round_ in range(40):
        buf.add_rollouts([r for i in range(round_ * 5, round_ * 5 + 5) for r in group(i)])
        buf.ack(buf.sample_groups(5).batch_id, "ok")
    [snapshot] = glob.glob(os.path.join(root, "control", "snapshot-*.json"))
    assert "exited" not in json.load(open(snapshot))
    exits = {}
    for f in glob.glob(os.path.join(root, "control", "exits-*.json")):
        exits.update(json.load(open(f)))
    assert len(exits) >= 150 and set(exits.values()) == {"consumed"}
    buf.add_rollouts(group(1000))
    buf.close()

    again = ReplayBuffer(root, target_group_size=2, max_uses_per_group=1, durable=False)
    assert again.stats()["groups_live"] == 1
    batch = again.sample_groups(10)
    assert [g.example_id for g in again.get_groups(batch.group_ids)] == ["q1000"]
    again.close()

    # The old layout: every exit inside the snapshot, no exits files.
    state = json.load(open(glob.glob(os.path.join(root, "control", "snapshot-*.json"))[0]))
    every = {}
    for f in glob.glob(os.path.join(root, "control", "exits-*.json")):
        every.update(json.load(open(f)))
        os.remove(f)
    state["exited"] = every
    json.dump(state, open(glob.glob(os.path.join(root, "control", "snapshot-*.json"))[0], "w"))
    old = ReplayBuffer(root, target_group_size=2, max_uses_per_group=1, durable=False)
    assert old.stats()["groups_live"] == 1 and len(old._control.exited) == len(every)
    old.close()
    migrated = ReplayBuffer(root, target_group_size=2, max_uses_per_group=1, durable=False)
    assert migrated.stats()["groups_live"] == 1 and len(migrated._control.exited) == len(every)
    migrated.close()


def test_a_failed_snapshot_leaves_no_consumed_group_drawable(tmp_path, monkeypatch):
    """The ack was logged and applied, then the snapshot after it failed, and the
    consumed group stayed in the live set: the next draw served it again."""
    import numpy as np
    import pytest

    from rollout_buffer.replay import RolloutRecord
    from rollout_buffer.replay import buffer as replay_buffer

    monkeypatch.setattr(replay_buffer, "SNAPSHOT_EVERY", 1)
    buf = ReplayBuffer(str(tmp_path / "replay"), target_group_size=2, max_uses_per_group=1,
                       durable=False)
    buf.add_rollouts([RolloutRecord(environment="m", example_id="q", policy_version="1",
                                    rollout_uid=f"u{j}", output_tokens=np.arange(2, dtype=np.int32))
                      for j in range(2)])
    batch = buf.sample_groups(1)

    def fail(state, exits):
        raise OSError("the store is full")

    monkeypatch.setattr(buf._log, "snapshot", fail)
    with pytest.raises(OSError, match="full"):
        buf.ack(batch.batch_id, "ok")
    monkeypatch.undo()  # the store works again
    assert buf.sample_groups(1).group_ids == [], "the consumed group was served again"
    assert buf.stats()["groups_live"] == 0 and buf.stats()["consumed"] == 1
    buf.close()
