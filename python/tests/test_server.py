"""The `rollout-buffer` server driven exactly as slime drives its rollout buffer: the
generator's `requests` POSTs of trajectory items, the consumer's `/get_rollout_data`
polling loop and its `finished_groups` bookkeeping, with the server killed (SIGKILL) and
restarted on its store halfway; and its Prometheus text read by prometheus_client's
parser. Each test runs twice: against the binary and against the wheel's `rollout-buffer`
console script, which runs the same server inside a Python process.

The binary comes from `cargo build -p rollout-buffer-server` (CI builds it before this
suite); set ROLLOUT_BUFFER_SERVER to use another."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

import pytest

requests = pytest.importorskip("requests")
parser = pytest.importorskip("prometheus_client.parser")

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("ROLLOUT_BUFFER_SERVER", str(ROOT / "target" / "debug" / "rollout-buffer"))


def console_script():
    """The installed `rollout-buffer` console script (a virtualenv's or the user's)."""
    user = sysconfig.get_preferred_scheme("user") if hasattr(sysconfig, "get_preferred_scheme") else f"{os.name}_user"
    for scheme in (None, user):
        scripts = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        found = shutil.which("rollout-buffer", path=scripts)
        if found:
            return found
    assert not os.environ.get("CI"), "CI installs the package with its console script"
    pytest.skip("the rollout-buffer console script is not installed")


def command(kind):
    if kind == "script":
        return [console_script()]
    if not os.path.exists(BINARY):
        assert not os.environ.get("CI"), f"CI must build {BINARY}"
        pytest.skip(f"{BINARY} is not built (cargo build -p rollout-buffer-server)")
    return [BINARY]


class Server:
    def __init__(self, kind, store, *args, stderr=subprocess.DEVNULL):
        self.proc = subprocess.Popen(
            [*command(kind), "serve", "--store", str(store), "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        self.url = line[len("listening on "):]

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(timeout=30)


@pytest.fixture(params=["binary", "script"])
def servers(request):
    started = []

    def start(store, *args):
        s = Server(request.param, store, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.kill()


def send_data_to_buffer(url, item):
    """slime's generator: POST one finished trajectory, two tries."""
    for _ in range(2):
        r = requests.post(f"{url}/buffer/write", json=item, timeout=30)
        if r.status_code == 200:
            return r.json()
    raise AssertionError(f"write failed: {r.status_code} {r.text}")


def trajectory(instance, k, reward):
    return {
        "uid": f"{instance}-{k}",
        "instance_id": instance,
        "messages": [
            {"role": "user", "content": f"question {instance}"},
            {"role": "assistant", "content": f"answer {k}"},
        ],
        "reward": reward,
        "extra_info": {"timestamp": str(time.time()), "round_number": 1, "finish_reason": "stop"},
    }


def fetch(url, need, deadline_s=30.0):
    """slime's consumer: poll /get_rollout_data with {} until `need` items came back,
    recording `finished_groups` as its data buffer's metadata does."""
    results, finished = [], []
    deadline = time.monotonic() + deadline_s
    while len(results) < need:
        assert time.monotonic() < deadline, f"only {len(results)} of {need} items"
        r = requests.post(f"{url}/get_rollout_data", json={}, timeout=30).json()
        if r["success"]:
            results.extend(r["data"]["data"])
            finished.extend(r["data"]["meta_info"]["finished_groups"])
        else:
            # What slime's loop does between polls; the data is already written here, so
            # this only runs if a group is still on its way.
            time.sleep(0.05)
    return results, finished


def test_slime_generator_and_consumer_with_a_restart_halfway(servers, tmp_path):
    store = tmp_path / "store"
    server = servers(store)
    payload = {
        "num_process": "4", "num_epoch": "1", "remote_engine_url": "http://127.0.0.1:1",
        "remote_buffer_url": server.url, "task_type": "math", "input_file": "x.jsonl",
        "num_repeat_per_sample": "4", "max_tokens": 16, "skip_instance_ids": [],
    }
    assert requests.post(f"{server.url}/start_rollout", json=payload).json()["message"] == "Rollout started"
    for i in range(3):
        for k in range(4):
            send_data_to_buffer(server.url, trajectory(f"q{i}", k, float(k % 2)))
    # Half of q3's group, then the server dies without a chance to flush.
    for k in range(2):
        send_data_to_buffer(server.url, trajectory("q3", k, float(k % 2)))
    server.kill()

    server = servers(store, "--group-size", "4")
    for k in range(2, 4):
        send_data_to_buffer(server.url, trajectory("q3", k, float(k % 2)))
    results, finished = fetch(server.url, 16)
    assert sorted(r["uid"] for r in results) == sorted(f"q{i}-{k}" for i in range(4) for k in range(4))
    assert sorted(finished) == ["q0", "q1", "q2", "q3"]
    for r in results:
        assert set(r) >= {"uid", "instance_id", "messages", "reward", "extra_info", "raw_reward"}
        assert r["messages"][-1]["role"] == "assistant"
    # GRPO-normalized per group: the rewards of each group sum to zero.
    for i in range(4):
        rewards = [r["reward"] for r in results if r["instance_id"] == f"q{i}"]
        assert abs(sum(rewards)) < 1e-6
    assert server.stop() == 0


def test_metrics_parse_as_prometheus_text(servers, tmp_path):
    server = servers(tmp_path / "store", "--group-size", "2")
    for k in range(2):
        send_data_to_buffer(server.url, trajectory("q", k, float(k)))
    text = requests.get(f"{server.url}/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("rollout_buffer_http_items_written_total", ())] == 2
    assert samples[("rollout_buffer_ingest_stored_groups", ())] == 1
    assert samples[("rollout_buffer_rpc_eligible", (("rpc", "train"),))] == 1
    assert samples[("rollout_buffer_groups_in_buffer", (("environment", "slime"),))] == 1


def test_the_console_script_is_the_packages_command_line():
    from importlib.metadata import distribution

    (script,) = [
        ep for ep in distribution("rollout-buffer").entry_points
        if ep.group == "console_scripts" and ep.name == "rollout-buffer"
    ]
    assert script.value == "rollout_buffer.cli:main"
    help_text = subprocess.run([console_script(), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert help_text.returncode == 0 and "--store" in help_text.stdout, help_text
    # `python -m rollout_buffer.cli` is the same; a mistake is clap's usage error, code 2.
    for wrong_args, named in (
        (["serve", "--listen", "127.0.0.1:0"], "--store"),
        (["serve", "--store", "x", "--durability", "often"], "`often`"),
    ):
        wrong = subprocess.run(
            [sys.executable, "-m", "rollout_buffer.cli", *wrong_args], capture_output=True, text=True, timeout=60,
        )
        assert wrong.returncode == 2 and named in wrong.stderr, wrong


def test_ctrl_c_stops_the_console_scripts_server_cleanly(tmp_path):
    """SIGINT, as Ctrl-C sends it, is the server's graceful stop inside Python too: it
    flushes and exits 0 (no KeyboardInterrupt traceback). The log is written only every
    ten minutes, so the writes are on the store after the restart only if the stop
    flushed them."""
    store = tmp_path / "store"
    args = ("--group-size", "2", "--durability", "interval:600000")
    server = Server("script", store, *args, stderr=subprocess.PIPE)
    try:
        for k in range(2):
            send_data_to_buffer(server.url, trajectory("q", k, float(k)))
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=30) == 0
        assert "KeyboardInterrupt" not in server.proc.stderr.read()
    finally:
        if server.proc.poll() is None:
            server.kill()
    again = Server("script", store, *args)
    try:
        results, finished = fetch(again.url, 2)
        assert sorted(r["uid"] for r in results) == ["q-0", "q-1"] and finished == ["q"]
    finally:
        assert again.stop() == 0
