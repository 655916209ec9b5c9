"""The training loop end to end: result files, sim vs ddp agreement, time model, failures."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import failure, make_run, run_cli
from gravac.cluster.netmodel import NetworkModel

SMALL = ["dataset.image_size=8", "dataset.train_size=512", "dataset.test_size=128", "model.width=4",
         "train.batch_size=8", "train.eval_every=5", "logger.progress=false"]


def _run(tmp_path: Path, args: list[str], env: dict | None = None, timeout=300):
    small = [a for a in SMALL if not (a.startswith("model.") and any(x.startswith("model=") for x in args))]
    r = run_cli([*small, f"experiment.results_root={tmp_path}", *args], timeout=timeout, env=env)
    runs = sorted(p for p in tmp_path.glob("*/*") if p.is_dir())
    return r, runs


def _steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("b,n,bw,lat,ar,ag", [
    (4e6, 2, 10, 0, 2 * 1 / 2 * 4e6 / 1.25e9, 1 * 4e6 / 1.25e9),
    (1e6, 8, 1, 10, 2 * 7 * 1e-5 + 2 * 7 / 8 * 1e6 / 1.25e8, 7 * 1e-5 + 7 * 1e6 / 1.25e8),
    (123, 1, 100, 5, 0.0, 0.0),
])
def test_network_model_costs(b, n, bw, lat, ar, ag):
    net = NetworkModel(alpha_s=lat * 1e-6, beta_Bps=bw * 1e9 / 8)
    assert net.allreduce(b, n) == pytest.approx(ar)
    assert net.allgather(b, n) == pytest.approx(ag)


def test_network_calibration_hits_ratio():
    net = NetworkModel(alpha_s=1e-5, beta_Bps=1.0)
    net.calibrate(dense_bytes=4e6, workers=4, compute_s=0.05, ratio=2.0)
    assert net.allreduce(4e6, 4) == pytest.approx(0.1)


def test_dense_run_writes_valid_results(tmp_path):
    r, runs = _run(tmp_path, ["train.steps=10", "cluster.workers=2"])
    assert r.returncode == 0, failure(r)
    (run,) = runs
    steps = _steps(run)
    assert [s["step"] for s in steps] == list(range(10))
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [5, 10]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["floats_sent"] == 10 * summary["parameters"]
    assert summary["wire_bytes"] == 10 * 4 * summary["parameters"]
    assert all(s["cf"] == 1 and s["floats_sent"] == summary["parameters"] for s in steps)
    assert summary["model_s"] == pytest.approx(sum(s["step_model_s"] for s in steps))
    prof = summary["clock"]["profile"]          # modelled time: the device profile, not this run's measurements
    for s in steps:
        assert s["compute_model_s"] == pytest.approx(prof["forward_s"] + prof["backward_s"])
        assert s["step_model_s"] == pytest.approx(s["compute_model_s"] + s["compress_model_s"] + s["comm_model_s"]
                                                   + prof["optimizer_s"])
        assert s["step_overlap_model_s"] <= s["step_model_s"] + 1e-12
        assert s["comm_model_s"] > 0
        assert s["step_wall_s"] == pytest.approx(s["compute_s"] + s["compress_s"] + s["comm_s"] + s["optimizer_s"])
    assert summary["network"]["bandwidth_gbps"] == 10
    assert (run / "config.yaml").exists()


def _compare_backends(tmp_path, extra):
    # one thread per worker on both backends, so per-worker gradients are computed identically
    extra = ["cluster.threads=1", "train.lr=0.02", *extra]
    sim, (sim_run,) = _run(tmp_path / "sim", ["train.steps=20", "cluster=sim", "cluster.workers=2", *extra])
    assert sim.returncode == 0, failure(sim)
    ddp, (ddp_run,) = _run(tmp_path / "ddp", ["train.steps=20", "cluster=ddp", "cluster.workers=2", *extra])
    assert ddp.returncode == 0, failure(ddp)
    a, b = _steps(sim_run), _steps(ddp_run)
    assert len(a) == len(b) == 20
    for x, y in zip(a, b):
        assert x["floats_sent"] == y["floats_sent"] and x["wire_bytes"] == y["wire_bytes"]
        assert math.isclose(x["loss"], y["loss"], rel_tol=1e-4, abs_tol=1e-5), (x["step"], x["loss"], y["loss"])


@pytest.mark.slow          # ~20 s idle; static Top-k below compares the backends in the default suite
def test_sim_and_ddp_agree_dense(tmp_path):
    _compare_backends(tmp_path, [])


def test_sim_and_ddp_agree_static_topk(tmp_path):
    _compare_backends(tmp_path, ["method=static", "compressor=topk", "compressor.cf=50"])


def test_ddp_worker_that_raises_stops_the_run(tmp_path):
    t0 = time.time()
    r, (run,) = _run(tmp_path, ["train.steps=50", "cluster=ddp", "cluster.workers=2", "cluster.timeout_s=20"],
                     env={"GRAVAC_FAULT": "1:3:raise"}, timeout=120)
    assert r.returncode != 0
    assert time.time() - t0 < 90
    assert "worker rank 1" in r.stderr and "injected fault" in r.stderr
    steps = _steps(run)
    assert [s["step"] for s in steps] == [0, 1, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("worker rank 1 failed"), summary["error"]


def test_nan_loss_stops_with_message(tmp_path):
    r, (run,) = _run(tmp_path, ["train.steps=20"], env={"GRAVAC_FAULT": "0:4:nan"})
    assert r.returncode == 2
    assert "step 4" in r.stderr and "method=dense" in r.stderr and "Traceback" not in r.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and "step 4" in summary["error"]


def test_sim_refuses_a_cluster_that_does_not_fit(tmp_path):
    r, runs = _run(tmp_path, ["model=vgg16", "dataset=synthetic", "dataset.image_size=32", "cluster.workers=64",
                              "cluster.max_memory_gb=8", "method=static", "compressor=topk"])
    assert r.returncode == 2
    assert "GiB" in r.stderr and "cluster.workers" in r.stderr and "cluster=ddp" in r.stderr
    assert "Traceback" not in r.stderr
    assert runs == []          # refused before its first step: no run folder is left (issue 41)


NO_DATA = ["dataset=cifar10", "dataset.download=false", "logger.progress=false", "cluster.threads=1"]


@pytest.mark.parametrize("backend", [["cluster=sim"], ["cluster=ddp", "cluster.workers=2"],
                                     ["-m", "train.seed=0,1"]], ids=["sim", "ddp", "sweep"])
def test_a_run_that_fails_before_its_first_step_leaves_no_run_folder(tmp_path, backend):
    """Issue 41: a missing dataset left an empty run folder (config, empty records, a failed
    summary) per run and per sweep job. Now nothing is left under the results root but the
    sweep's own folder, and the error is one line per process, without a traceback."""
    (tmp_path / "no-data").mkdir()
    root = tmp_path / "results"
    r = run_cli([*backend, *NO_DATA, f"dataset.root={tmp_path / 'no-data'}", f"experiment.results_root={root}"],
                timeout=300)
    assert r.returncode == 2, failure(r)
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr and all(e.startswith("error: ") for e in errors), failure(r)
    assert "CIFAR-10 not found" in errors[0]
    if "cluster=ddp" in backend:
        assert errors[-1].endswith("the run failed before its first step, so no run folder was kept"), errors
    runs = [p for p in root.glob("*/*") if p.name != ".multirun"]
    assert runs == [], runs
    if "-m" not in backend:     # nor an experiment folder made for it (a sweep's holds its .multirun)
        assert list(root.rglob("*")) == []


@pytest.mark.parametrize("files,kept", [
    ({}, False),                                                        # what a missing dataset leaves
    ({"steps.jsonl": '{"step": 0}\n'}, True),                          # a step was recorded
    ({"evals.jsonl": '{"step": 0}\n'}, True),
    ({"checkpoint/latest": "0"}, True),
    ({"model.pt": "x"}, True),
    ({"summary.json": '{"status": "diverged"}'}, True),                 # says why it stopped
    ({"summary.json": '{"status": "interrupted"}'}, True),
    ({"wandb/run.log": "x"}, True),                                     # anything else: not ours to drop
    ({"command.txt.tmp.31462": "python bench"}, False),                # rank 0 killed mid-write by a peer's failure
    ({"model.pt.tmp.31462": "x"}, True),                                # only the fresh files' own copies
    ({"command.txt.tmp.x1": "python bench"}, True),
])
def test_only_a_run_folder_that_recorded_nothing_is_discarded(tmp_path, files, kept):
    from gravac.run.outcome import discard_unstarted
    run = tmp_path / "exp" / "run"
    run.mkdir(parents=True)
    start = {"config.yaml": "a: 1\n", "command.txt": "python bench/run.py\n", ".lock": "1\n", "steps.jsonl": "",
             "evals.jsonl": "", "summary.json": '{"status": "failed", "error": "CIFAR-10 not found"}'}
    for name, text in {**start, **files}.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    assert discard_unstarted(str(run)) is (not kept)
    assert run.exists() is kept and (tmp_path / "exp").exists() is kept   # an emptied experiment folder goes too


def test_a_resumed_run_folder_is_never_discarded(tmp_path):
    from gravac.run.launch import _discard_if_unstarted
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("a: 1\n")
    cfg = make_run(experiment=dict(resume=str(run)))
    assert not _discard_if_unstarted(cfg, str(run), RuntimeError("data gone")) and run.exists()
    cfg = make_run()
    assert _discard_if_unstarted(cfg, str(run), RuntimeError("data gone")) and not run.exists()


@pytest.mark.parametrize("kind, says", [("exit", "worker rank 1 failed (exit code 17)"),
                                        ("kill", "worker rank 1 was killed by SIGKILL before it could say why")])
def test_ddp_worker_killed_stops_the_run(tmp_path, kind, says):
    """A rank that dies is the one named, even when its peer's broken collective fails in the same
    instant (a SIGKILLed rank is named by its signal: it printed nothing)."""
    t0 = time.time()
    r, (run,) = _run(tmp_path, ["train.steps=50", "cluster=ddp", "cluster.workers=2", "cluster.timeout_s=20"],
                     env={"GRAVAC_FAULT": f"1:3:{kind}"}, timeout=180)
    assert r.returncode != 0 and time.time() - t0 < 120
    assert says in r.stderr, failure(r)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and says in json.dumps(summary)
    assert [s["step"] for s in _steps(run)] == [0, 1, 2]


def test_a_ddp_run_with_its_progress_bar_leaks_no_semaphore(tmp_path):
    """Issue 20: tqdm's multiprocessing write lock, made in rank 0 and never unregistered by its
    os._exit, ended every ddp run with "resource_tracker: ... 1 leaked semaphore objects"."""
    r, (run,) = _run(tmp_path, ["train.steps=3", "cluster=ddp", "cluster.workers=2", "cluster.threads=1",
                                "logger.progress=true"])
    assert r.returncode == 0, failure(r)
    assert "3/3" in r.stderr             # the bar was drawn, so its lock existed
    assert "leaked semaphore" not in r.stderr and "resource_tracker" not in r.stderr, failure(r)


@pytest.mark.slow
def test_ddp_hung_worker_times_out(tmp_path):
    t0 = time.time()
    r, (run,) = _run(tmp_path, ["train.steps=50", "cluster=ddp", "cluster.workers=2", "cluster.timeout_s=5"],
                     env={"GRAVAC_FAULT": "1:3:hang"}, timeout=300)
    assert r.returncode != 0 and time.time() - t0 < 150, failure(r)
    assert "worker rank 1 stopped answering at step 3" in r.stderr, failure(r)
    assert "crashed" not in r.stderr, failure(r)
    # one line, naming the communication layer's call (only gravac/cluster/comm.py talks to other workers)
    assert re.search(r"worker rank 0: a collective failed at \S+comm\.py:\d+ in \w+ \(", r.stderr), failure(r)
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


class _Proc:
    """A stand-in for a spawned worker: its exit code, read by `_join`, appears after `after` polls."""

    def __init__(self, code, after=0):
        self.code, self.after, self.killed = code, after, False

    @property
    def exitcode(self):
        if self.killed:
            return -9
        self.after -= 1
        return self.code if self.after < 0 else None

    def is_alive(self):
        return self.exitcode is None

    def kill(self):
        self.killed = True

    def join(self, timeout):
        pass


@pytest.mark.parametrize("codes, blamed", [
    ([(3, 0), (17, 0)], (1, 17, {0: 3})),        # CI, stop 54: both seen in one poll, rank 0's gloo read error
    ([(3, 0), (17, 3)], (1, 17, {0: 3})),        # the peer's own exit is seen a few polls after the symptom
    ([(3, 0), (-9, 0)], (1, -9, {0: 3})),        # a SIGKILLed rank before everything
    ([(1, 0), (3, 0)], (0, 1, {1: 3})),          # rank 0 failed on its own account, rank 1 lost it
    ([(3, 0), (None, 0)], (0, 3, {})),           # a hung peer: killed after the grace, not blamed here
    ([(130, 0), (3, 0)], (1, 3, {0: 130})),
])
def test_join_blames_the_rank_that_failed_on_its_own_account(codes, blamed, monkeypatch):
    """A rank whose collective failed (exit PEER_LOST) is a symptom: the peer that exited on its own
    account, even when seen in the same poll or a few polls later, is the one named."""
    from types import SimpleNamespace

    from gravac.run import launch
    clock = [0.0]       # a fake clock: each poll's sleep advances it, so the grace ends without waiting
    monkeypatch.setattr(launch.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(launch.time, "monotonic", lambda: clock[0])
    procs = [_Proc(c, after) for c, after in codes]
    assert launch._join(SimpleNamespace(processes=procs)) == blamed
    assert launch.PEER_LOST == 3


def test_an_error_raised_inside_torch_distributed_counts_as_a_failed_collective_and_names_its_caller():
    import torch
    import torch.distributed as dist

    from gravac.run.launch import _collective_call
    try:
        dist.all_reduce(torch.zeros(1))     # no process group: raised from torch/distributed
    except Exception as e:
        where = _collective_call(e)
        assert where is not None and where.startswith(__file__) and where.endswith(
            "in test_an_error_raised_inside_torch_distributed_counts_as_a_failed_collective_and_names_its_caller"), where
    else:
        pytest.fail("all_reduce without a process group did not raise")
    try:
        raise RuntimeError("the worker's own bug")
    except RuntimeError as e:
        assert _collective_call(e) is None


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_multirun_skips_jobs_identical_to_an_earlier_one(tmp_path):
    # dense ignores the compressor (Dense.ignores: "compressor."), gravac ignores compressor.cf
    r = run_cli(["-m", "method=dense,gravac", "compressor=topk,dgc", "compressor.cf=10,100", "train.steps=2",
                 "cluster.threads=1", *SMALL, f"experiment.results_root={tmp_path}"], timeout=600)
    assert r.returncode == 0, failure(r)
    skipped = [line for line in r.stdout.splitlines() if line.startswith("skipped job #")]
    assert skipped == [
        "skipped job #1 (compressor.cf=100): identical to job #0 (compressor.cf=10); dense ignores compressor.cf",
        "skipped job #2 (compressor=dgc): identical to job #0 (compressor=topk); dense ignores compressor",
        "skipped job #3 (compressor=dgc compressor.cf=100): identical to job #0 (compressor=topk compressor.cf=10); "
        "dense ignores compressor, compressor.cf",
        "skipped job #5 (compressor.cf=100): identical to job #4 (compressor.cf=10); gravac ignores compressor.cf",
        "skipped job #7 (compressor.cf=100): identical to job #6 (compressor.cf=10); gravac ignores compressor.cf"]
    runs = sorted(p.name for p in tmp_path.glob("default/*") if p.is_dir() and not p.name.startswith("."))
    assert len(runs) == 3, runs          # no folder, not even a failed one, for a skipped job
    assert sum("-dense-" in n for n in runs) == 1 and sum("-gravac-topk-" in n for n in runs) == 1
    for run in tmp_path.glob("default/2*"):
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_sweep_key_sets_aside_only_what_the_method_ignores():
    from conftest import make_run
    from gravac.config.compose import sweep_key

    def key(method, **comp):
        return sweep_key(make_run(method=dict(name=method), compressor=comp))
    assert key("static", name="topk", cf=10) != key("static", name="topk", cf=100)     # static uses its CF
    assert key("static", name="topk", cf=10) != key("static", name="dgc", cf=10)
    assert key("gravac", name="dgc", cf=10) == key("gravac", name="dgc", cf=100)
    assert key("gravac", name="dgc", cf=10) != key("gravac", name="topk", cf=10)       # but not its compressor
    assert key("dense", name="topk", cf=10) == key("dense", name="dgc", cf=100)


def test_lr_schedule_warm_up_then_milestones():
    """Linear warm-up reaches lr at step warmup_steps - 1, then the milestones decay it; a decay is
    flagged only when lr falls (a rising warm-up is not Accordion's 'after a decay')."""
    from gravac.core.schema import TrainCfg
    from gravac.loop.train import lr_at
    t = TrainCfg(lr=0.4, warmup_steps=4, milestones=[6], gamma=0.5)
    assert [lr_at(t, s) for s in range(8)] == [0.1, 0.2, 0.30000000000000004, 0.4, 0.4, 0.4, 0.2, 0.2]
    assert [lr_at(TrainCfg(lr=0.4), s) for s in (0, 5)] == [0.4, 0.4]


# A network namespace of its own (gone with its last process, so nothing is left to clean up)
# where the host name resolves to 192.0.2.2, an address of a veth interface: what made gloo listen
# on the network (issue 33 case 3). $1: a hosts file mapping the name; the rest: the command.
ROUTABLE_HOST = """set -e
ip link set lo up
ip link add gvbr0 type veth peer name gvbr1
ip addr add 192.0.2.2/24 dev gvbr0
ip link set gvbr0 up
ip link set gvbr1 up
mount --bind "$1" /etc/hosts
hostname gravac-routable
shift
exec "$@"
"""


def _routable_host(hosts: Path, argv: list[str]) -> list[str]:
    return ["unshare", "--net", "--uts", "--mount", "sh", "-c", ROUTABLE_HOST, "sh", str(hosts), *argv]


def _listening(pid: int) -> list[str]:
    """Local addresses of the listening TCP sockets in the network namespace of `pid`."""
    out = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ss", "-ltnH"], capture_output=True, text=True,
                         check=True).stdout
    return [line.split()[3] for line in out.splitlines() if line.strip()]


def test_a_one_machine_ddp_run_listens_on_loopback_only(tmp_path):
    """Issue 33 case 3: gloo binds the address the host name resolves to; where that is routable
    (192.0.2.2 here), a one-machine cluster=ddp run listened on the network. The run is made in a
    namespace of its own whose host name resolves so (the only honest way to make that happen on
    any machine), and while it trains every listening socket there must be on loopback."""
    import ipaddress
    import signal
    import sys
    from conftest import ROOT
    missing = [t for t in ("unshare", "nsenter", "ip", "ss", "mount") if shutil.which(t) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"needs root and {', '.join(missing) or 'unshare, nsenter, ip, ss'} for a network namespace")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost\n192.0.2.2 gravac-routable\n")
    probe = subprocess.run(_routable_host(hosts, ["true"]), capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace with a veth here: {probe.stderr.strip()[-200:]}")
    root = tmp_path / "results"
    argv = [sys.executable, str(ROOT / "bench" / "run.py"), *SMALL, "train.steps=400", "cluster=ddp",
            "cluster.workers=2", "cluster.threads=1", f"experiment.results_root={root}"]
    with open(tmp_path / "out", "w") as out:
        proc = subprocess.Popen(_routable_host(hosts, argv), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        t0 = time.time()
        while not any(p.stat().st_size for p in root.glob("*/*/steps.jsonl")):   # the workers are connected
            assert proc.poll() is None and time.time() - t0 < 240, (tmp_path / "out").read_text()[-2000:]
            time.sleep(0.1)
        listening = _listening(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)      # the launcher stops its workers at a step boundary
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert listening, "gloo listens on something; ss saw nothing"
    hosts_seen = [a.rsplit(":", 1)[0].strip("[]") for a in listening]
    assert all(ipaddress.ip_address(h).is_loopback for h in hosts_seen), listening


def test_the_last_line_gives_the_modelled_time_the_tables_use(tmp_path):
    """Issue 41, item 4: the run's last lines said the serial modelled time while the tables use the
    overlapped one. Now: the overlapped time, then the serial sum in brackets when they differ."""
    from gravac.run.launch import _modelled
    assert _modelled({"overlap_model_s": 4.93, "model_s": 5.31}) == "4.9 s (serial 5.3 s)"
    assert _modelled({"overlap_model_s": 5.31, "model_s": 5.34}) == "5.3 s"
    assert _modelled({"model_s": 5.31}) == "5.3 s"
    assert _modelled({"overlap_model_s": 4.93, "model_s": 5.31, "clock": {"overlap": False}}) == "5.3 s (overlapped 4.9 s)"
    r, runs = _run(tmp_path, ["train.steps=6", "network=1gbps"])
    assert r.returncode == 0, r.stderr
    s = json.loads((runs[0] / "summary.json").read_text())
    done = next(line for line in r.stdout.splitlines() if line.startswith("done: "))
    assert f"modelled {_modelled(s)}, wall" in done and f"modelled {s['overlap_model_s']:.1f} s" in done


def test_progress_in_a_log_file_is_plain_lines_with_an_eta():
    """Issue 41, item 7: with stderr not a terminal, tqdm wrote the whole run as one line. Now one
    line every progress_every_s seconds and at the end, with the rate and the time left."""
    import io
    from gravac.loop.track import LineProgress, duration
    assert [duration(s) for s in (12, 286, 7500)] == ["12 s", "4 min 46 s", "2 h 05 min"]
    now = [100.0]
    out = io.StringIO()
    p = LineProgress(10, every_s=30, clock=lambda: now[0], out=out)
    p.start_at(2)                                   # resumed after 2 steps
    for _ in range(8):
        now[0] += 10.0                              # 10 s a step
        p.set_postfix({"loss": "1.234"})
        p.update(1)
    assert out.getvalue().splitlines() == [
        "step 5/10 (50%), 10 s/step, ETA 50 s, loss 1.234",
        "step 8/10 (80%), 10 s/step, ETA 20 s, loss 1.234",
        "step 10/10 (100%), 10 s/step, loss 1.234"]


def test_a_run_logged_to_a_file_prints_progress_lines(tmp_path):
    r, _ = _run(tmp_path, ["train.steps=4", "logger.progress=true", "logger.progress_every_s=0"])
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("step ")]
    assert [ln.split(",")[0] for ln in lines] == ["step 1/4 (25%)", "step 2/4 (50%)", "step 3/4 (75%)", "step 4/4 (100%)"]
    assert "ETA" in lines[0] and "\r" not in r.stderr
