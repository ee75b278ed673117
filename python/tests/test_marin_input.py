"""rollout_buffer.marin given input of the wrong kind, and the console script's argument
handling (the package's other pure-Python front).

Marin: constructor arguments and steps that are no ints or no finite numbers, rollouts
whose reward, weight step, timestamp or env name is of the wrong kind, loss modules
giving the wrong advantages and lists that hold no batches are a ValueError naming the
parameter or the batch, group and rollout, with none of the call stored; a draw whose
recency weights overflow counts nothing; waits and the loader's interval refuse NaN;
an add racing set_current_step stores nothing stale. The console script: argv that is
one string, holds no strings or is not UTF-8, SIGINT's handler after main, and main run
from a thread."""

import signal
import threading
import time

import numpy as np
import pytest

from rollout_buffer import cli
from rollout_buffer.marin import ReplayBuffer, ReplayBufferConfig, ReplayDataLoader


class Meta:
    def __init__(self, weight_step=0, timestamp=None):
        self.weight_step = weight_step
        self.timestamp = time.time() if timestamp is None else timestamp


class R:
    """A rollout as the buffer reads it."""

    def __init__(self, env="math", example="e", reward=1.0, step=0, timestamp=None):
        self.env_name, self.env_example_id, self.episode_reward = env, example, reward
        self.metadata = Meta(step, timestamp)


class Group:
    def __init__(self, rollouts, group_id=None):
        self.rollouts = rollouts
        self.metadata = type("M", (), {"group_id": group_id, "lesson_id": None})()


class Batch:
    def __init__(self, *groups):
        self.groups = list(groups)


def group(env="math", n=4, tag="", step=0, group_id=None):
    return Group([R(env, f"{tag}{env}-{k}", float(k % 2), step) for k in range(n)], group_id)


def buffer(**kw):
    args = dict(capacity=1000, local_batch_size=4, alpha=3.0, max_samples=-1, max_rollout_step_delay=1, seed=7)
    args.update(kw)
    return ReplayBuffer(**args)


def assert_empty(buf):
    stats = buf.get_stats()
    assert stats["total_size"] == 0 and stats["total_batches_added"] == 0 and stats["num_environments"] == 0, stats
    # No member of a refused call is left behind in a group record either: a later
    # group with the same id holds its own members only.
    buf.add_batches([Batch(group(n=4, group_id="g1", tag="after"))])
    records = {g.group_id: g for g in buf.sample_groups()}
    assert [r.env_example_id for r in records["g1"].trajectories] == [f"aftermath-{k}" for k in range(4)]


# ----- the constructor --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("capacity", 2.5),  # was kept as 2
        ("capacity", True),  # was 1
        ("capacity", None),  # a TypeError naming nothing
        ("local_batch_size", 1.5),
        ("local_batch_size", "8"),
        ("alpha", float("nan")),  # failed at the first draw, "Probabilities contain NaN"
        ("alpha", float("inf")),
        ("alpha", "3"),  # was 3.0
        ("max_samples", 1.5),
        ("max_rollout_step_delay", -1),  # nothing could ever be fresh: a silent starve
        ("max_rollout_step_delay", 0.5),
        ("max_rollout_timestamp_delay", float("nan")),  # every rollout stale
        ("max_rollout_timestamp_delay", 0.0),
        ("total_processes", 0),
        ("filter_out_groups_with_no_variance", "no"),  # bool("no") is True
        ("loss_module", 5),  # failed at the first add
        ("seed", -1),  # numpy's "expected non-negative integer", naming no argument
        ("seed", 1.5),  # a TypeError
    ],
)
def test_the_constructor_names_an_argument_of_the_wrong_kind(name, value):
    with pytest.raises(ValueError, match=name):
        buffer(**{name: value})


def test_a_config_of_the_wrong_kind_is_refused_by_from_config():
    config = ReplayBufferConfig(capacity=10, alpha=1.0, max_samples=1.5, max_rollout_step_delay=0)
    with pytest.raises(ValueError, match="max_samples"):
        ReplayBuffer.from_config(config, local_batch_size=4)
    ok = ReplayBufferConfig(capacity=np.int64(10), alpha=np.float32(1.0), max_samples=-1, max_rollout_step_delay=0)
    assert ReplayBuffer.from_config(ok, local_batch_size=np.int32(4)).capacity == 10


@pytest.mark.parametrize("step", ["3", 1.9, None, True, float("nan"), 2**70])
def test_set_current_step_takes_only_an_int_and_keeps_nothing_it_refuses(step):
    buf = buffer()
    buf.add_batches([Batch(group())])
    with pytest.raises(ValueError, match="step"):
        buf.set_current_step(step)
    assert buf.size() == 4, "the step was set before the check, and the rollouts dropped"
    buf.set_current_step(np.int64(1))
    assert buf.size() == 4


# ----- rollouts ---------------------------------------------------------------------------


def bad_reward(v):
    g = group(tag="bad")
    g.rollouts[2].episode_reward = v
    return g


def bad_meta(field, v, k=2):
    g = group(tag="bad")
    setattr(g.rollouts[k].metadata, field, v)
    return g


@pytest.mark.parametrize(
    "bad, message",
    [
        # A NaN or None reward made every advantage of its group NaN; a string was parsed.
        (bad_reward(float("nan")), r"groups\[1\]\.rollouts\[2\] \(env 'math', example 'badmath-2'\): episode_reward"),
        (bad_reward(float("inf")), "episode_reward must be a finite number"),
        (bad_reward(None), "episode_reward"),
        (bad_reward("1.0"), "episode_reward"),
        (bad_reward(True), "episode_reward"),
        (bad_reward(np.array([0.5, 1.0])), "episode_reward"),
        (bad_reward(2**1100), "episode_reward"),
        # A weight step past int64 (or None) failed the store half done; 1.9 was 1.
        (bad_meta("weight_step", 2**70), r"groups\[1\]\.rollouts\[2\].*metadata\.weight_step"),
        (bad_meta("weight_step", None), "metadata.weight_step"),
        (bad_meta("weight_step", 0.9, k=0), "metadata.weight_step"),
        (bad_meta("weight_step", "0"), "metadata.weight_step"),
        (bad_meta("timestamp", "abc"), "metadata.timestamp"),
        (bad_meta("timestamp", str(time.time())), "metadata.timestamp"),  # was parsed
        (bad_meta("timestamp", float("nan")), "metadata.timestamp"),
        (Group([R(env=None), R(env=None)]), "env_name must be a str"),
        # Only the last rollout's env_name was checked: None and b"math" were stored and
        # served under "math".
        (Group([R(env=None), R(env=b"math"), R()]), r"rollouts\[0\]: env_name must be a str"),
        (Group([R(), R(env=b"math"), R()]), r"rollouts\[1\]: env_name must be a str, not bytes"),
        # A numpy complex became its real part, with only a numpy warning.
        (bad_reward(np.complex128(1 + 2j)), "episode_reward"),
        (bad_reward(1 + 2j), "episode_reward"),
        (Group([R(), R()], group_id=["unhashable"]), "group_id"),
    ],
)
def test_a_bad_rollout_is_named_and_none_of_the_call_is_stored(bad, message):
    buf = buffer()
    # A good group of another environment first, then the bad group: the good one was
    # stored before the failure.
    with pytest.raises(ValueError, match=message):
        buf.add_batches([Batch(group("code"), bad)])
    assert_empty(buf)


def test_the_first_rollout_of_a_batch_is_checked_before_its_freshness():
    buf = buffer()
    g = group()
    g.rollouts[0].metadata.weight_step = float("nan")  # was "cannot convert float NaN to integer"
    with pytest.raises(ValueError, match=r"new_batches\[1\]\.groups\[0\]\.rollouts\[0\]"):
        buf.add_batches([Batch(group("code")), Batch(g)])
    assert_empty(buf)


class Advantages:
    def __init__(self, make):
        self.make = make

    def compute_advantages(self, rollouts):
        return self.make(len(rollouts))


@pytest.mark.parametrize(
    "make",
    [
        lambda n: np.zeros(n - 1),  # "2 advantages for 3 rollouts", raised under the lock
        lambda n: None,
        lambda n: ["a"] * n,
        lambda n: np.zeros((n, 2)),
        lambda n: np.full(n, np.nan),  # stored as the rollouts' advantages
    ],
)
def test_a_loss_module_giving_the_wrong_advantages_stores_nothing(make):
    calls = []

    def adv(n):
        calls.append(n)
        return np.zeros(n) if len(calls) == 1 else make(n)

    buf = buffer(loss_module=Advantages(adv))
    with pytest.raises(ValueError, match=r"groups\[1\]: loss_module\.compute_advantages must give 4 finite numbers"):
        buf.add_batches([Batch(group(), group(tag="b"))])
    calls.clear()
    assert_empty(buf)


@pytest.mark.parametrize(
    "arg, message",
    [
        (None, "new_batches must be a list of rollout batches"),  # a TypeError
        (Batch(group()), "new_batches must be a list"),  # a batch alone: a TypeError
        ("batches", "new_batches must be a list"),
        ([group()], r"new_batches\[0\] is no rollout batch"),  # a group: skipped as empty
        ([None], r"new_batches\[0\] is no rollout batch"),
        ([Batch()], None),  # Marin's skip: no groups
        ([Batch(group(), "x")], r"new_batches\[0\]\.groups\[1\] is no rollout group"),
    ],
)
def test_lists_that_hold_no_batches_are_refused(arg, message):
    buf = buffer()
    if message is None:
        buf.add_batches(arg)
    else:
        with pytest.raises(ValueError, match=message):
            buf.add_batches(arg)
    assert_empty(buf)


def test_an_add_racing_set_current_step_keeps_nothing_stale():
    buf = buffer(max_rollout_step_delay=1)
    buf.set_current_step(1)

    class Racing:
        """The trainer moves to step 3 while the add computes advantages (outside the
        lock): rollouts of step 1 are then two behind."""

        def compute_advantages(self, rollouts):
            buf.set_current_step(3)
            return np.zeros(len(rollouts))

    buf.loss_module = Racing()
    buf.add_batches([Batch(group(step=1))])
    assert buf.size() == 0, "stale rollouts stored after set_current_step dropped the stale ones"
    buf.loss_module = Advantages(np.zeros)
    buf.add_batches([Batch(group(step=3, tag="new"))])
    assert buf.size() == 4


# ----- draws and waits --------------------------------------------------------------------


def test_a_draw_whose_weights_overflow_counts_nothing_and_names_alpha():
    # (i + 1) ** 120 passes 1e308 from i = 369: env "a" (weight step 1) draws, env "b"
    # (weight step 0, 400 rollouts) cannot.
    def fill(buf, with_b):
        buf.set_current_step(1)
        buf.add_batches([Batch(Group([R("a", f"a{i}", 1.0, 1) for i in range(360)]))])
        if with_b:
            buf.add_batches([Batch(Group([R("b", f"b{i}", 1.0, 0) for i in range(400)]))])

    for seed in range(10):
        buf = buffer(alpha=120.0, local_batch_size=300, max_samples=2, seed=seed)
        fill(buf, True)
        with pytest.raises(ValueError, match=r"alpha=120\.0: .*environment 'b' \(400 rollouts\)"):
            buf.sample_rollouts()
        buf.set_current_step(2)  # drops "b" (step 0), keeps "a" (step 1)
        twin = buffer(alpha=120.0, local_batch_size=300, max_samples=2, seed=seed)
        fill(twin, False)
        twin.set_current_step(2)
        got, want = buf.sample_rollouts(), twin.sample_rollouts()
        # The failed draw moved neither the generator nor the uses: the next draw is the
        # one a buffer that never failed makes.
        assert [x.rollout.env_example_id for x in got] == [x.rollout.env_example_id for x in want]
        assert {x.usage_count for x in got} == {1}, "uses of the failed draw were counted"
        assert buf.get_stats()["total_batches_sampled"] == 1


def run_with_deadline(fn, seconds=10.0):
    out = []

    def go():
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(("raised", e))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the call hung"
    return out[0]


@pytest.mark.parametrize("timeout", [float("nan"), "1", [1]])
def test_a_wait_refuses_a_nan_timeout_instead_of_waiting_forever(timeout):
    kind, value = run_with_deadline(lambda: buffer().wait_for_batch(timeout))
    assert kind == "raised" and isinstance(value, ValueError) and "timeout" in str(value)


@pytest.mark.parametrize("timeout", [None, float("inf"), 1e300, 2**70])
def test_a_wait_without_end_returns_the_batch_when_it_comes(timeout):
    # None was a TypeError and infinity an OverflowError ("timestamp out of range").
    buf = buffer()
    timer = threading.Timer(0.1, lambda: buf.add_batches([Batch(group())]))
    timer.start()
    try:
        kind, value = run_with_deadline(lambda: buf.wait_for_batch(timeout))
    finally:
        timer.cancel()
    assert kind == "ok" and len(value) == 4


class Reader:
    def __init__(self, block=None):
        self.calls, self.block = 0, block

    def read_all_available(self):
        self.calls += 1
        if self.block is not None:
            self.block.wait(10)
        return []


@pytest.mark.parametrize("interval", [float("nan"), 0, -1, None, "0.1", float("inf"), True])
def test_the_loader_refuses_an_interval_that_would_spin_stall_or_kill_it(interval):
    # NaN, 0 and -1 spun the loop at full CPU, None read once and never again, and a
    # string or infinity killed the thread (get_rollouts then only ever timed out).
    with pytest.raises(ValueError, match="rollout_fetch_interval"):
        ReplayDataLoader(Reader(), buffer(), interval)


def test_a_loader_with_an_interval_past_the_lock_limit_waits_until_stopped(monkeypatch):
    # Event.wait(1e13) raised OverflowError after the first read, ending the thread.
    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    reader = Reader()
    loader = ReplayDataLoader(reader, buffer(), 1e13)
    loader.start()
    deadline = time.monotonic() + 10
    while reader.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reader.calls == 1
    loader._thread.join(timeout=0.2)
    assert loader._thread.is_alive(), "the loader waits for its next read"
    loader.stop()
    assert loader._thread is None, "stopped within the join timeout"
    assert died == [], died
    assert reader.calls == 1


def test_a_loader_stopped_while_its_reader_blocks_is_not_started_twice():
    block = threading.Event()
    reader = Reader(block)
    loader = ReplayDataLoader(reader, buffer(), 0.01)
    loader._join_timeout = 0.1
    loader.start()
    deadline = time.monotonic() + 10
    while reader.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    loader.stop()  # the thread is still inside read_all_available
    with pytest.raises(RuntimeError, match="still stopping"):
        loader.start()  # was a second loop beside the first, two readers at once
    block.set()
    loader._join_timeout = 10.0
    loader.stop()
    loader.start()  # once the first is gone, it starts again
    loader.stop()


# ----- the console script -------------------------------------------------------------------


def run_cli(argv):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    return exit_.value.code


def test_cli_argv_must_be_a_list_of_strings(tmp_path, capfd):
    with pytest.raises(ValueError, match="argv must be a list of str"):
        cli.main("inspect")  # ran as "i" "n" "s" ...: "unrecognized subcommand 'i'"
    with pytest.raises(ValueError, match=r"argv\[1\] must be a str, not int"):
        cli.main(["inspect", 5])
    # A path is an argument (it was a TypeError).
    assert run_cli(["inspect", tmp_path / "none"]) == 1
    assert "no stored run" in capfd.readouterr().err  # written by the extension


def test_cli_arguments_that_are_not_utf8_are_a_usage_error(capsys):
    # sys.argv holds such bytes as lone surrogates; the script raised UnicodeEncodeError
    # where the binary answers with clap's error and code 2.
    assert run_cli(["inspect", "/tmp/\udcff"]) == 2
    assert "invalid UTF-8" in capsys.readouterr().err


def test_cli_gives_sigint_back_to_python_and_runs_from_a_thread():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert run_cli(["--version"]) == 0
    # It was left at SIG_DFL: Ctrl-C then killed the caller instead of raising
    # KeyboardInterrupt.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    kind, value = run_with_deadline(lambda: run_cli(["--version"]))
    assert (kind, value) == ("ok", 0), value  # was "signal only works in main thread"


# ----- the loader's waits and reads ----------------------------------------------------------


class WatchedCondition(threading.Condition):
    """The buffer's condition, telling when a waiter is inside ``wait``: set under the lock,
    so whoever takes the lock after it comes after the waiter's release."""

    def __init__(self):
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


@pytest.mark.parametrize("get", ["get_rollouts", "get_trajectories", "get_groups"])
def test_stop_ends_the_gets_waiting_without_end(get):
    """A get_rollouts(None) waited on after stop() (forever, with no rollouts coming), and
    a thread left waiting by a cancelled asyncio task drew the next batch for nobody, its
    uses counted. stop() now ends the waits, which draw nothing; later gets serve."""
    buf = buffer(max_samples=1)
    buf._cond = WatchedCondition()
    loader = ReplayDataLoader(Reader(), buf)
    waiter = threading.Thread(target=lambda: out.append(getattr(loader, get)(None)), daemon=True)
    out = []
    waiter.start()
    assert buf._cond.waiting.wait(10), "the get waits"
    loader.stop()
    waiter.join(10)
    assert not waiter.is_alive() and out == [None]
    buf.add_batches([Batch(group())])
    assert buf.get_stats()["total_batches_sampled"] == 0
    assert getattr(loader, get)(timeout=0) is not None, "a get after stop() still serves"


@pytest.mark.parametrize("get", ["get_rollouts", "get_trajectories", "get_groups"])
def test_a_get_on_a_stopped_loader_serves_what_is_ready_and_never_waits(get):
    """A get started after stop() waited forever with no timeout: nothing comes from a
    stopped loader. It now serves what is ready and otherwise returns None at once, until
    the loader starts again."""
    buf = buffer(max_samples=1)
    loader = ReplayDataLoader(Reader(), buf)
    loader.start()
    loader.stop()
    done = []
    waiter = threading.Thread(target=lambda: done.append(getattr(loader, get)(None)), daemon=True)
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive() and done == [None], "a get after stop() waited"
    buf.add_batches([Batch(group())])
    assert getattr(loader, get)(None) is not None, "what is ready is served"
    with pytest.raises(ValueError, match="timeout"):
        getattr(loader, get)(float("nan"))
    loader.start()
    try:
        assert getattr(loader, get)(timeout=0) is None  # a running loader's get may wait
    finally:
        loader.stop()


class Batches:
    """A reader handing over what it holds once."""

    def __init__(self, batches):
        self.batches = batches

    def read_all_available(self):
        out, self.batches = self.batches, []
        return out


def test_a_refused_batch_drops_alone_not_the_good_batches_read_with_it(caplog):
    """add_batches takes all of a call or none, and the reader had already handed the
    batches over: one bad batch lost every good batch of its read."""
    bad = Batch(bad_reward(float("nan")))
    good = [Batch(group(tag=f"g{i}")) for i in range(3)]
    buf = buffer(local_batch_size=12)
    loader = ReplayDataLoader(Batches(good[:2] + [bad] + good[2:]), buf)
    with caplog.at_level("ERROR", logger="rollout_buffer.marin"), loader:
        got = loader.get_rollouts(timeout=10)
    assert got is not None and len(got) == 12
    assert buf.get_stats()["total_batches_added"] == 3
    assert {x.rollout.env_example_id for x in got} == {f"g{i}math-{k}" for i in range(3) for k in range(4)}
    [dropped] = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert "batch 2 of the 4 read dropped" in dropped.getMessage() and "episode_reward" in dropped.getMessage()


def test_a_loss_module_raising_for_one_batch_drops_it_alone(caplog):
    """Only a ValueError split a refused read: a loss module raising anything else for one
    group still lost every good batch read with it."""

    class Picky:
        def compute_advantages(self, rollouts):
            if any(r.env_example_id.startswith("bad") for r in rollouts):
                raise RuntimeError("no advantage for this prompt")
            return [0.0] * len(rollouts)

    good = [Batch(group(tag=f"g{i}")) for i in range(3)]
    buf = buffer(local_batch_size=12, loss_module=Picky())
    loader = ReplayDataLoader(Batches(good[:1] + [Batch(group(tag="bad"))] + good[1:]), buf)
    with caplog.at_level("ERROR", logger="rollout_buffer.marin"), loader:
        got = loader.get_rollouts(timeout=10)
    assert got is not None and len(got) == 12
    assert buf.get_stats()["total_batches_added"] == 3
    assert any("batch 1 of the 4 read dropped" in r.getMessage() for r in caplog.records)
