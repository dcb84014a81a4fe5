"""Issue 29, item 1: tuning through TVM's RPC tracker and servers on 127.0.0.1 (each server
limited to one thread): the records match a local tune's with several workers measuring at
once, and a wrong server, a dead tracker or an empty key is one line (a server killed
mid-tune: tests/test_rpc_kill.py)."""

import json
import math

import pytest
from rpc_farm import TINY, free_port, records, spawn, tune, verify, wait_for
from rpc_farm import farm as _farm

from sandwich.compiler.rpc import servers_under

pytestmark = pytest.mark.tvm
farm = pytest.fixture(scope="module")(_farm)


def test_an_rpc_tune_stores_what_a_local_tune_does(farm, tmp_path):
    addr, _ = farm
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    # three workers asked, two servers: two measure at once (a third would wait forever);
    # two of the payload's shapes are enough to compare
    p = tune(cfg, tmp_path / "rpc", "--ops", "qkv,down", "--rpc", str(addr), "--rpc-key", "farm",
             "--rpc-workers", "3")
    assert p.returncode == 0, p.stderr
    assert "measuring on the RPC servers under key 'farm' at" in p.stdout
    assert "2 at once" in p.stdout and "--rpc-workers 3: the tracker has 2 server(s)" in p.stderr
    local = tune(cfg, tmp_path / "local", "--ops", "qkv,down")
    assert local.returncode == 0, local.stderr
    remote, here = records(tmp_path / "rpc"), records(tmp_path / "local")
    # the same shapes, M ranges and weight layout; which schedule wins is measured, and at
    # these tiny shapes several are within noise (7 to 16 of 16 micro-kernels agreed in
    # runs here), so the check is that the servers' timings are the local timer's: the
    # winners' GFLOPS agree in geomean within the noise of a shared 2-core machine
    assert [r[:4] for r in remote] == [r[:4] for r in here]
    assert all(r[4]["pack_n"] == h[4]["pack_n"] for r, h in zip(remote, here, strict=True))
    ratios = [r[5] / h[5] for r, h in zip(remote, here, strict=True)]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert 0.6 < geomean < 1.6 and all(0.25 < x < 4 for x in ratios), ratios
    verify(tmp_path / "rpc")


def test_wrong_servers_and_dead_trackers_are_one_line(farm, tmp_path):
    addr, procs = farm
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    port = free_port()
    plain = spawn("-m", "tvm.exec.rpc_server", "--tracker", str(addr), "--key", "plain",
                  "--port", str(port), "--port-end", str(port + 1))
    procs.append(plain)
    wait_for(lambda: servers_under(addr, "plain") == 1, "the plain TVM server")
    for extra, match in (
            (("--rpc", str(addr), "--rpc-key", "plain"), "is a plain TVM server"),
            (("--rpc", str(addr), "--rpc-key", "nobody"), "has no server under key 'nobody'"),
            (("--rpc", f"127.0.0.1:{free_port()}"), "is unreachable"),
            (("--rpc", "nohost"), "must be HOST:PORT")):
        p = tune(cfg, tmp_path / "c", *extra)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1 and match in lines[0], p.stderr
    assert not (tmp_path / "c" / "tuning.sqlite").exists() or not records(tmp_path / "c")
