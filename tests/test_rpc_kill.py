"""Issue 29, item 1: a TVM RPC server killed mid-tune costs nothing: its candidate runs again
on another server, the tune finishes and its cache verifies, with one worker or two."""

import json
import os
import sqlite3
import subprocess
import sys

import psutil
import pytest
from rpc_farm import TINY, free_port, kill, spawn, verify, wait_for
from rpc_farm import farm as _farm

from sandwich.compiler.rpc import servers_under

pytestmark = pytest.mark.tvm
farm = pytest.fixture(scope="module")(_farm)  # this module kills servers: a farm of its own


def _kill_a_busy_server_mid_tune(addr, procs, tmp_path, *extra):
    """Start a tune on the farm, kill a server in a session once a record is stored, and
    return the tune's (stdout, stderr) after checking it finished and its cache verifies."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    cache = tmp_path / "rpc"
    tune = subprocess.Popen([sys.executable, "-m", "sandwich.cli", "tune", "--model", str(cfg),
                             "--seq-max", "16", "--budget", "tiny", "--threads", "1",
                             "--no-progress", "--cache-dir", str(cache), "--rpc", str(addr),
                             "--rpc-key", "farm", "--rpc-timeout", "20", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TVM_NUM_THREADS": "1"})

    def first_record() -> bool:
        try:
            return sqlite3.connect(cache / "tuning.sqlite", timeout=1).execute(
                "SELECT COUNT(*) FROM records").fetchone()[0] > 0
        except sqlite3.Error:
            return False

    wait_for(first_record, "the first record", timeout=300)
    # the busy server is the one with a session process
    busy = [p for p in procs[1:] if p.poll() is None and psutil.Process(p.pid).children(recursive=True)]
    assert busy, "no server is in a session"
    kill(busy[0])
    out, err = tune.communicate(timeout=600)
    assert tune.returncode == 0, err
    retried = int(out.split("RPC: ")[1].split()[0])
    assert retried >= 1, out  # the killed server's call ran again on the other one
    verify(cache)
    return out, err


def test_a_server_killed_mid_tune_costs_nothing(farm, tmp_path):
    addr, procs = farm
    _kill_a_busy_server_mid_tune(addr, procs, tmp_path, "--ops", "qkv,gate_up")


def test_a_server_killed_under_two_workers_leaves_one_measuring(farm, tmp_path):
    addr, procs = farm  # the test above killed one server: start another
    procs.append(spawn("-m", "sandwich.cli", "rpc-server", "--tracker", str(addr), "--key", "farm",
                       "--threads", "1", "--port", str(free_port())))
    wait_for(lambda: servers_under(addr, "farm") == 2, "two servers at the tracker")
    # two shapes are enough; a server that never came free is given up on after 10 s
    out, err = _kill_a_busy_server_mid_tune(addr, procs, tmp_path, "--rpc-workers", "2",
                                            "--ops", "qkv,gate_up", "--rpc-timeout", "10")
    assert "2 at once" in out
    assert "stopped" in err and "measuring on 1 server(s)" in err, err
