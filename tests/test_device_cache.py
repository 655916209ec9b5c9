"""The clock's device cache: profiles keyed by the model's structure, every cached entry checked,
a named device read-only unless `clock.extend_machine`, and one line for whatever is wrong."""
from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import ROOT, make_run, run_cli

SMALL = ["dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64", "model.width=4",
         "train.batch_size=8", "train.steps=2", "train.eval_every=10", "logger.progress=false", "cluster.threads=1",
         "cluster.workers=2", "method=static", "compressor=topk", "network=1gbps"]


class Workers:
    """What Clock.build reads of the run's workers: `layers` parameters and a measurement that
    counts its calls (no model is run)."""

    def __init__(self, layers: int):
        self.params = [torch.nn.Parameter(torch.zeros(4, 4)) for _ in range(layers)]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.calls = 0

    def input_shape(self) -> list[int]:
        return [8, 3, 8, 8]

    def measure_profile(self, repeats: int) -> dict:
        self.calls += 1
        n = len(self.params)
        return {"forward_s": 0.01, "backward_s": 0.02, "ready_s": [0.02 * (n - i) / n for i in range(n)],
                "optimizer_s": 0.001}


def build(cache: Path, layers: int = 2, workers: Workers | None = None, **clock):
    """Clock.build of a run on `cache`; (clock, workers, printed lines)."""
    from gravac.cluster.clock import Clock
    from gravac.cluster.comm import SimGroup
    from gravac.cluster.netmodel import NetworkModel
    cfg = make_run(clock=dict(cache_dir=str(cache), repeats=1, **clock))
    workers = workers or Workers(layers)
    lines: list[str] = []
    clock = Clock.build(cfg, workers, SimGroup(2, NetworkModel(alpha_s=1e-5, beta_Bps=1e9)), lines.append)
    return clock, workers, lines


def refused(cache: Path, layers: int = 2, **clock) -> str:
    """The one line Clock.build refuses with."""
    from gravac.core.errors import UserError
    with pytest.raises(UserError) as e:
        build(cache, layers, **clock)
    assert "\n" not in str(e.value)
    return str(e.value)


def device(tmp_path: Path, layers: int = 2) -> Path:
    """A cache folder holding device 'ref' with one profile (of a `layers`-parameter model)."""
    cache = tmp_path / "dev"
    build(cache, layers, machine="ref", extend_machine=True)
    return cache


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def first(data: dict) -> dict:
    (entry,) = data.values()
    return entry


# --- case 8: keyed by the model's structure; every cached entry checked ----------------------

def test_a_model_that_grows_under_the_same_config_gets_its_own_profile(tmp_path):
    """A plug-in model grown from 2 to 12 layers under the same config reused the 2-layer profile."""
    build(tmp_path, 2)
    clock, workers, _ = build(tmp_path, 12)
    assert workers.calls == 1 and clock.profile.source == "calibrated"
    assert len(clock.profile.ready_s) == 12
    clock, workers, _ = build(tmp_path, 12)               # and the 12-layer one is cached in turn
    assert workers.calls == 0 and len(clock.profile.ready_s) == 12


DAMAGE = {
    "three of the ready offsets": lambda e: e.update(ready_s=e["ready_s"][:3]),
    "a NaN forward time": lambda e: e.update(forward_s=float("nan")),
    "a negative backward time": lambda e: e.update(backward_s=-24.8),
    "a negative ready offset": lambda e: e["ready_s"].__setitem__(1, -0.5),
    "an unknown field": lambda e: e.update(speed=3),
    "no ready offsets": lambda e: e.pop("ready_s"),
    "a string for a number": lambda e: e.update(optimizer_s="fast"),
}
WHY = {"three of the ready offsets": "ready_s has 3 offsets for a model of 6 parameter tensors",
       "a NaN forward time": "forward_s is nan, not a finite number > 0",
       "a negative backward time": "backward_s is -24.8, not a finite number > 0",
       "a negative ready offset": "ready_s[1] is -0.5, not a finite number >= 0",
       "an unknown field": "has unknown field(s) speed", "no ready offsets": "lacks ready_s",
       "a string for a number": 'optimizer_s is "fast", not a number'}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_profile_in_this_hosts_cache_is_measured_again(tmp_path, damage):
    build(tmp_path, 6)
    edit(tmp_path / "devices.json", lambda d: DAMAGE[damage](first(d)))
    clock, workers, lines = build(tmp_path, 6)
    assert workers.calls == 1 and clock.profile.source == "calibrated"
    assert any(f"devices.json {WHY[damage]}: measuring it again" in line for line in lines), lines
    from gravac.cluster.profile import profile_problem
    assert profile_problem(first(json.loads((tmp_path / "devices.json").read_text())), 6) is None   # replaced
    assert all(0 < r <= clock.profile.backward_s for r in clock.profile.ready_s)


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_profile_of_a_named_device_is_refused_in_one_line(tmp_path, damage):
    cache = device(tmp_path, 6)
    edit(cache / "devices.json", lambda d: DAMAGE[damage](first(d)))
    before = (cache / "devices.json").read_bytes()
    for extend in (False, True):        # extending adds what is missing, never replaces what is there
        line = refused(cache, 6, machine="ref", extend_machine=extend)
        assert line.startswith(f"{cache / 'devices.json'}: entry ") and WHY[damage] in line, line
        assert "of device 'ref'" in line and "git checkout" in line
    assert (cache / "devices.json").read_bytes() == before


@pytest.mark.parametrize("value, why", [(float("nan"), "is nan, not a finite number >= 0"),
                                        (-24.8, "is -24.8, not a finite number >= 0"),
                                        ("0.1", 'is "0.1", not a number'), ([0.1], "is [0.1], not a number")])
def test_a_damaged_op_cost_is_measured_again_here_and_refused_on_a_named_device(tmp_path, value, why):
    from gravac.cluster.comm import SimGroup
    from gravac.core.errors import UserError
    from gravac.cluster.netmodel import NetworkModel
    from gravac.cluster.opcosts import OpCosts
    group = SimGroup(2, NetworkModel(alpha_s=1e-5, beta_Bps=1e9))
    for named in (False, True):
        cache = tmp_path / str(named)
        OpCosts(group, cache, "m", repeats=1, named=named, extend=True).cost("topk:100", lambda: None, 0.25)
        edit(cache / "ops.json", lambda d: d.update({k: value for k in d}))
        lines = []
        costs = OpCosts(group, cache, "m", repeats=1, named=named, say=lines.append)
        if named:
            with pytest.raises(UserError, match="^" + re.escape(f"{cache / 'ops.json'}: entry ")) as e:
                costs.share()
            assert why in str(e.value) and "of device 'm'" in str(e.value)
            continue
        costs.share()
        assert any(why in line and "measured again" in line for line in lines), lines
        assert costs.cost("topk:100", lambda: None, 0.5) == 0.5          # re-measured, and it replaces the bad one
        assert OpCosts(group, cache, "m").table == {"topk:100": 0.5}


# --- case 9: a named device is read-only unless clock.extend_machine ------------------------

def study_device(tmp_path: Path) -> Path:
    """A copy of the committed study device (results/reference/device)."""
    dev = tmp_path / "device"
    shutil.copytree(ROOT / "results" / "reference" / "device", dev)
    return dev


def test_an_unknown_device_name_is_refused_listing_the_known_ones(tmp_path):
    """clock.machine=no-such-device measured this host and stored it under the typo."""
    cache = study_device(tmp_path)
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    line = refused(cache, machine="no-such-device")
    assert line.startswith(f"clock.machine=no-such-device: {cache} holds no device of that name (known: "
                           "reference-cpu); check clock.machine and clock.cache_dir"), line
    assert "clock.extend_machine=true" in line
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == before
    assert "(known: none)" in refused(tmp_path / "empty", machine="reference-cpu")
    assert not (tmp_path / "empty").exists()               # nothing created either


def test_a_named_device_lacking_a_model_refuses_it_and_writes_nothing(tmp_path):
    cache = device(tmp_path, 2)
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    line = refused(cache, 5, machine="ref")
    assert line.startswith("device 'ref' has no profile for resnet_mini on synthetic (input [8, 3, 8, 8], "
                           f"5 parameter tensors) in {cache / 'devices.json'}; known: resnet_mini on synthetic "
                           "(input [8, 3, 8, 8], 2 parameter tensors); measure one on this host and add it with "
                           "clock.extend_machine=true"), line
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == before


def test_extending_a_named_device_adds_what_it_lacks_and_says_so(tmp_path):
    cache = device(tmp_path, 2)
    clock, workers, lines = build(cache, 5, machine="ref", extend_machine=True)
    host = clock.costs.host
    assert workers.calls == 1 and host.startswith("torch ")
    assert [line for line in lines if "device profile" in line] == [
        f"device profile measured on this host ({host}): forward 10.0 ms, backward 20.0 ms, optimizer 1.0 ms; "
        f"added to device 'ref' as resnet_mini on synthetic (input [8, 3, 8, 8], 5 parameter tensors) in "
        f"{cache / 'devices.json'}"]
    entries = json.loads((cache / "devices.json").read_text())
    added = entries[clock.profile.key]
    assert (added["machine"], added["host"], len(added["ready_s"])) == ("ref", host, 5)
    assert clock.measured_here() == {"host": host, "profile": clock.profile.key, "op_costs": []}
    # an operation the device lacks: measured here, added, printed
    assert clock.costs.cost("topk:7", lambda: None, 0.002) == 0.002
    assert lines[-1] == (f"compression cost topk:7 measured on this host ({host}): 2 ms; added to device 'ref' in "
                         f"{cache / 'ops.json'}")
    assert clock.describe()["measured_here"]["op_costs"] == ["topk:7"]
    # read back without extending: the same numbers, nothing measured
    again, workers, lines = build(cache, 5, machine="ref")
    assert workers.calls == 0 and again.profile.ready_s == clock.profile.ready_s and not lines
    assert again.costs.table == {"topk:7": 0.002}
    assert again.measured_here() == {"host": host, "profile": None, "op_costs": []}


def test_a_named_device_lacking_an_op_cost_refuses_it_in_one_line(tmp_path):
    from gravac.core.errors import UserError
    cache = device(tmp_path)
    clock, _, _ = build(cache, machine="ref")
    with pytest.raises(UserError) as e:
        clock.costs.cost("dgc:abc:compress(cf=10)", lambda: None, 0.1)
    assert str(e.value) == (f"device 'ref' has no cost for compression operation dgc:abc:compress(cf=10) in "
                            f"{cache / 'ops.json'}; measure it on this host and add it with clock.extend_machine=true "
                            "(or drop clock.machine to cost this host in its own cache)")
    assert not (cache / "ops.json").exists()


def test_extend_machine_needs_a_machine_name():
    from gravac.config.compose import ConfigError
    with pytest.raises(ConfigError, match=r"^clock.extend_machine=true adds to a named device: set clock.machine"):
        make_run(clock=dict(extend_machine=True))


def test_the_study_device_refuses_a_model_it_lacks_without_writing(tmp_path):
    """`clock.machine=reference-cpu` and a model missing from that table wrote this host's numbers
    into the committed devices.json; now the run stops in one line (a copy of the folder here)."""
    dev = study_device(tmp_path)
    before = {p.name: p.read_bytes() for p in dev.iterdir()}
    r = run_cli([*SMALL, f"experiment.results_root={tmp_path / 'runs'}", "clock.machine=reference-cpu",
                 f"clock.cache_dir={dev}"])
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "device 'reference-cpu' has no profile for resnet_mini on synthetic" in errors[0]
    assert "known: lstm_mini on ptb (input [35, 10], 10 parameter tensors); resnet_mini on cifar10" in errors[0]
    assert "Traceback" not in r.stderr
    assert {p.name: p.read_bytes() for p in dev.iterdir()} == before


# --- case 10: a wrong-shape file ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["devices.json", "ops.json"])
@pytest.mark.parametrize("text, why", [("{not json", "is not valid JSON"), ("[1, 2]", "holds a JSON list")])
def test_an_unreadable_file_of_a_named_device_is_one_line(tmp_path, name, text, why):
    cache = device(tmp_path)
    clock, _, _ = build(cache, machine="ref", extend_machine=True)
    clock.costs.cost("topk:1", lambda: None, 0.1)                  # so that ops.json exists
    (cache / name).write_text(text)
    line = refused(cache, machine="ref")
    assert line.startswith(f"device 'ref': {cache / name} {why}") and "git checkout" in line, line
    assert (cache / name).read_text() == text


# --- smaller: an unwritable cache says so ------------------------------------------------------

def test_a_read_only_cache_says_the_profile_was_not_cached(tmp_path, monkeypatch):
    def refuse(path, data):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr("gravac.cluster.profile.atomic_write", refuse)
    clock, _, lines = build(tmp_path)
    (line,) = [line for line in lines if line.startswith("device profile measured")]
    assert line.endswith(f"(not cached: cannot write {tmp_path / 'devices.json'}: Read-only file system)"), line
    assert "cached in" not in line
    clock.costs.cost("topk:1", lambda: None, 0.1)
    clock.costs.cost("topk:2", lambda: None, 0.1)
    assert [line for line in lines if "not cached" in line][1:] == [
        f"compression costs are measured but not cached: cannot write {tmp_path / 'ops.json'}: Read-only file "
        "system (later runs measure them again)"]              # once, not per operation


def test_a_parameter_backward_never_reaches_is_ready_when_backward_ends():
    """An unused parameter's ready offset was minus the clock's reading (a negative entry)."""
    from gravac.cluster.profile import measure_profile
    used, unused = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))

    def step(mark):
        loss = (used * 2).sum()
        mark()
        loss.backward()
    prof = measure_profile(step, [used, unused], lambda: None, 2)
    assert 0 <= prof["ready_s"][0] <= prof["ready_s"][1] == pytest.approx(prof["backward_s"], abs=1e-3)


def test_a_named_devices_file_damaged_meanwhile_is_left_as_it_is(tmp_path):
    """An addition never replaces a named device's unreadable file with the one new entry."""
    from gravac.cluster.profile import JsonCache
    path = tmp_path / "ops.json"
    path.write_text("{}")
    store = JsonCache(path, keep_damaged=True)
    path.write_text("{damaged")                          # after it was read, before the addition
    assert store.update({"k": 1.0}).startswith(f"{path} is not valid JSON")
    assert path.read_text() == "{damaged"
    assert JsonCache(path).update({"k": 1.0}) is None      # this host's cache is rewritten
    assert json.loads(path.read_text()) == {"k": 1.0}


def test_a_run_refused_an_op_cost_can_resume_extending_the_device(tmp_path):
    """A run stopped by an operation its named device lacks resumes with clock.extend_machine=true
    (bookkeeping, like cluster.threads: what is measured does not change)."""
    import dataclasses

    import yaml

    from gravac.config.compose import saved_config
    from gravac.run.launch import check_resume
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "latest").write_text("step-00000002\n")
    cfg = make_run(clock=dict(machine="ref"))
    (run / "config.yaml").write_text(yaml.safe_dump(saved_config(cfg)))
    extend = dataclasses.replace(cfg, clock=dataclasses.replace(cfg.clock, extend_machine=True),
                                 experiment=dataclasses.replace(cfg.experiment, resume=str(run)))
    assert check_resume(extend) == str(run)


@pytest.fixture
def reference(tmp_path, monkeypatch):
    """A stand-in for the committed study device (results/reference/device), holding the profile of
    build()'s two-layer run, and one thread in this process (as the study device was measured)."""
    import gravac.cluster.clock as clock_mod
    import gravac.cluster.profile as profile_mod
    ref = tmp_path / "reference"
    build(ref, machine="reference-cpu", extend_machine=True)
    monkeypatch.setattr(profile_mod, "REFERENCE_DIR", ref)
    monkeypatch.setattr(clock_mod, "REFERENCE_DIR", ref)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ref
    torch.set_num_threads(threads)


def test_auto_takes_the_study_device_when_it_holds_the_runs_profile(reference, tmp_path):
    before = (reference / "devices.json").read_text()
    clock, workers, lines = build(tmp_path / "host")
    assert (clock.profile.machine, clock.profile.source, workers.calls) == ("reference-cpu", "cached", 0)
    assert lines[0].startswith("clock: modelled times from the study device 'reference-cpu'")
    # what the device lacks is this host's, for this run only: said once, never written into the device
    for op in ("topk:x:compress(cf=10)", "topk:x:compensate()"):
        clock.costs.cost(op, lambda: None, 0.002)
    assert [line for line in lines if "lacks" in line] == [
        "compression costs device 'reference-cpu' lacks are measured on this host "
        f"({clock.costs.host}) for this run only, first topk:x:compress(cf=10); summary.json's clock.measured_here "
        "lists them"]
    assert clock.measured_here()["op_costs"] == ["topk:x:compress(cf=10)", "topk:x:compensate()"]
    assert (reference / "devices.json").read_text() == before and not (reference / "ops.json").exists()


@pytest.mark.parametrize("differs", [dict(layers=3), dict(threads=2)])
def test_auto_profiles_this_host_for_another_model_or_thread_count(reference, tmp_path, differs):
    torch.set_num_threads(differs.get("threads", 1))
    clock, workers, lines = build(tmp_path / "host", layers=differs.get("layers", 2))
    assert workers.calls == 1 and clock.profile.machine.startswith("torch ")   # this host's key
    assert not any("study device" in line for line in lines)


def test_extend_machine_needs_a_named_device_not_auto():
    from gravac.config.compose import ConfigError
    with pytest.raises(ConfigError, match="extend_machine=true adds to a named device"):
        make_run(clock=dict(machine="auto", extend_machine=True))
