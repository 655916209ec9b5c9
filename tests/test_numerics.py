"""cluster.numerics=portable: the same bits on any x86-64 host, checked against committed records.

Every CI run lands on some host, so each run of these tests is a cross-host check of the records in
results/reference/portable/ (written on the CPU each record names)."""
from __future__ import annotations

import copy
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import ROOT, data_dir, make_run

sys.path.insert(0, str(ROOT / "bench"))
import records  # noqa: E402

# what a host with a different instruction set would choose by itself; portable mode must override it
OTHER_HOST = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
              "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _check(name: str, extra=(), env=None) -> None:
    problems = records.drift(records.load(name), records.rerun(name, list(extra), env))
    assert not problems, (f"record {name} drifted on {records.host()} (written on "
                          f"{records.load(name)['written_on']}):\n" + "\n".join(problems))


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_the_default_record_is_bit_identical_here_whatever_the_environment_asks():
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda env: _check("default_topk10", env=env), [None, OTHER_HOST]))


def test_the_record_says_how_it_computed():
    rec = records.load("default_topk10")
    assert rec["numerics"] == {"mode": "portable", "threads": 1, "cpu_capability": "DEFAULT",
                               "mkl_cbwr": "COMPATIBLE", "mkldnn": False, "nnpack": False}
    assert rec["written_on"]["cpu"] and len(rec["steps"]) == 20 and rec["evals"]


def test_drift_names_the_first_differing_row_of_each_field():
    rec = records.load("default_topk10")
    got = copy.deepcopy(rec)
    got["steps"][7]["loss"] = math.nextafter(got["steps"][7]["loss"], math.inf)   # one unit in the last place
    got["steps"][9]["loss"] += 1.0
    got["steps"][3]["step_model_s"] += 1e-12
    got["evals"][-1]["metric"] += 0.001
    assert records.drift(rec, rec) == []
    assert [p.split(":")[0] for p in records.drift(rec, got)] == [
        "steps[7].loss", "steps[3].step_model_s", f"evals[{len(rec['evals']) - 1}].metric"]
    got["steps"].pop()
    assert records.drift(rec, got)[0] == "steps: 19 rows, the record has 20"


@pytest.mark.parametrize("cluster, says", [
    (dict(numerics="portable", threads=2), "cluster.numerics=portable runs one thread per process"),
    (dict(numerics="portable", device="cuda"), "pins CPU kernels only"),
])
def test_portable_refuses_what_it_cannot_keep_exact(cluster, says):
    from gravac.config.compose import ConfigError
    with pytest.raises(ConfigError, match=says):
        make_run(cluster=cluster)


def test_a_process_that_already_computed_is_refused_not_left_native(monkeypatch):
    from gravac.cluster import numerics
    from gravac.core.errors import UserError
    torch.ones(8).sum()   # this test process has chosen its kernels long ago
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this host's ATen runs DEFAULT kernels natively")
    for k in numerics.PORTABLE_ENV:
        monkeypatch.setenv(k, os.environ.get(k, ""))   # restored after the test
    threads, mkldnn, nnpack = torch.get_num_threads(), torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled()
    try:
        with pytest.raises(UserError, match="before this process's first tensor operation.*bench/run.py"):
            numerics.apply("portable", 0)
    finally:
        torch.set_num_threads(threads)
        torch.backends.mkldnn.enabled = mkldnn
        torch.backends.nnpack.set_flags(nnpack)


@pytest.mark.slow
@pytest.mark.parametrize("name, data", [("vgg_mini_topk10", "cifar10"), ("lstm_mini_topk10", "ptb")])
def test_the_study_records_are_bit_identical_here(name, data):
    data_dir(data)
    _check(name)


@pytest.mark.slow
def test_native_numerics_do_differ_by_instruction_set():
    """The control: without the mode, the kernels ATen picks change the bits (so the records test something)."""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this host has no SIMD capability above DEFAULT to compare with")
    native = ["cluster.numerics=native", "cluster.threads=1"]
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda env: records.rerun("default_topk10", native, env),
                             [{"ATEN_CPU_CAPABILITY": "default"}, {}]))
    assert any("loss" in p for p in records.drift(*runs)), "native runs at two ATen capabilities gave the same losses"
