"""The collective cost model (gravac/cluster/netmodel.py): a profile's predictions against hand-computed
ones, the fit recovering known terms, bad profile files refused in one line, and `ideal` (the
default) giving exactly the alpha-beta numbers every existing result was modelled with."""
from __future__ import annotations

import json

import pytest

from gravac.cluster.netmodel import (COLLECTIVES, TERMS, CollectiveCost, CollectiveProfile, Measurement,
                                     NetworkModel, fit_profile, load_profile, steps, wire)
from gravac.core.check import ConfigError, checked
from gravac.core.errors import UserError
from gravac.core.schema import NetworkCfg

ALPHA, BETA = 1e-5, 1e6            # 10 us, 1 MB/s
TERMS_OF = {                       # call_s, step_s, link_factor, pair_factor, host_s_per_byte
    "allreduce": (1e-3, 2e-4, 1.5, 0.5, 1e-9),
    "allgather": (2e-3, 3e-4, 1.25, 0.75, 2e-9),
    "sparse_allgather": (4e-3, 1e-4, 1.1, 0.4, 3e-9),
    "broadcast": (5e-4, 6e-4, 1.05, 0.0, 4e-9),
}


def _profile_json(terms=TERMS_OF) -> dict:
    return {"name": "test", "collectives": {k: dict(zip(TERMS, v)) for k, v in terms.items()}}


def _profile(terms=TERMS_OF) -> CollectiveProfile:
    return CollectiveProfile("test", {k: CollectiveCost(*v) for k, v in terms.items()}, "test")


def _model(**kw) -> NetworkModel:
    return NetworkModel(alpha_s=ALPHA, beta_Bps=BETA, profile=_profile(), **kw)


def test_profile_predictions_by_hand():
    m, mb = _model(), 1e6
    c, s, l, p, h = TERMS_OF["allreduce"]     # ring: 2(N-1) steps, 2(N-1)/N of the tensor on each link
    assert m.allreduce(mb, 4) == pytest.approx(c + 6 * (ALPHA + s) + 1.5e6 * (l / BETA + h), rel=1e-12)
    assert m.allreduce(mb, 2) == pytest.approx(c + 2 * (ALPHA + s) + 1e6 * ((l + p) / BETA + h), rel=1e-12)
    c, s, l, p, h = TERMS_OF["allgather"]     # ring: N-1 steps, every other worker's b on each link
    assert m.allgather(mb, 4) == pytest.approx(c + 3 * (ALPHA + s) + 3e6 * (l / BETA + h), rel=1e-12)
    c, s, l, p, h = TERMS_OF["sparse_allgather"]   # counts (call cost, 8 B each), then padded payloads
    counts, payload = m.sparse_allgather(mb, 4)
    assert counts == pytest.approx(c + 3 * (ALPHA + s) + 24 * (l / BETA + h), rel=1e-12)
    assert payload == pytest.approx(3 * (ALPHA + s) + 3e6 * (l / BETA + h), rel=1e-12)
    assert sum(m.sparse_allgather(mb, 2)) == pytest.approx(c + 2 * (ALPHA + s) + (8 + 1e6) * ((l + p) / BETA + h))
    c, s, l, p, h = TERMS_OF["broadcast"]     # gloo's tree, N=4: root to ranks 1 and 2 at once, then 1 to 3
    assert m.broadcast(mb, 4) == pytest.approx(c + 2 * (ALPHA + s) + 3e6 * (l / BETA + h), rel=1e-12)
    assert m.broadcast(mb, 8) == pytest.approx(c + 3 * (ALPHA + s) + 6e6 * (l / BETA + h), rel=1e-12)
    for kind in COLLECTIVES:                   # one worker sends nothing
        assert m.predict(kind, mb, 1) == 0.0


def test_a_test_links_burst_passes_at_once():
    """bench/netval.py's links are tbf-shaped: `burst_bytes` of the wire bytes cost no link time."""
    c, s, l, p, h = TERMS_OF["allgather"]
    assert _model(burst_bytes=1e6).allgather(1e6, 4) == pytest.approx(c + 3 * (ALPHA + s) + 2e6 * l / BETA + 3e6 * h)
    assert _model(burst_bytes=1e7).allgather(1e6, 4) == pytest.approx(c + 3 * (ALPHA + s) + 3e6 * h)


CROWD = 7e-4                       # crowd_step_s of the crowded-host tests


def _crowded(**kw) -> NetworkModel:
    terms = {k: (*v, CROWD) for k, v in TERMS_OF.items()}
    return NetworkModel(alpha_s=ALPHA, beta_Bps=BETA, profile=_profile(terms), **kw)


def test_workers_sharing_cores_wait_per_message_by_hand():
    """N workers on C shared cores: each critical-path message costs (N/C - 1) crowd_step_s more;
    on separate machines (shared_cores 0) or one core each, nothing."""
    mb = 1e6
    c, s, l, p, h = TERMS_OF["allreduce"]
    base4 = c + 6 * (ALPHA + s) + 1.5e6 * (l / BETA + h)
    assert _crowded().allreduce(mb, 4) == pytest.approx(base4, rel=1e-12)
    assert _crowded(shared_cores=4).allreduce(mb, 4) == pytest.approx(base4, rel=1e-12)
    assert _crowded(shared_cores=2).allreduce(mb, 4) == pytest.approx(base4 + 6 * 1 * CROWD, rel=1e-12)
    assert _crowded(shared_cores=2).allreduce(mb, 8) == pytest.approx(
        c + 14 * (ALPHA + s + 3 * CROWD) + 1.75e6 * (l / BETA + h), rel=1e-12)
    c, s, l, p, h = TERMS_OF["sparse_allgather"]    # the counts' messages wait too
    counts, payload = _crowded(shared_cores=2).sparse_allgather(mb, 4)
    assert counts == pytest.approx(c + 3 * (ALPHA + s + CROWD) + 24 * (l / BETA + h), rel=1e-12)
    assert payload == pytest.approx(3 * (ALPHA + s + CROWD) + 3e6 * (l / BETA + h), rel=1e-12)
    c, s, l, p, h = TERMS_OF["broadcast"]           # two hops at N=4
    assert _crowded(shared_cores=2).broadcast(mb, 4) == pytest.approx(
        c + 2 * (ALPHA + s + CROWD) + 3e6 * (l / BETA + h), rel=1e-12)


def test_shared_cores_comes_from_config_and_is_checked():
    m = NetworkModel.from_cfg(NetworkCfg(collectives="gloo-cpu", shared_cores=2))
    assert m.shared_cores == 2 and m.describe()["shared_cores"] == 2
    with pytest.raises(ConfigError, match="shared_cores"):
        checked(NetworkCfg, {"shared_cores": -1}, "network")


def test_fit_separates_the_crowd_from_the_step():
    """Measured with 2 cores shared by N = 2, 4, 8 workers, the fit recovers step_s and crowd_step_s
    apart (N = 2 has no crowd)."""
    terms = {k: (*v, CROWD) for k, v in TERMS_OF.items()}
    truth, ms = _profile(terms), []
    for kind in COLLECTIVES:
        for n in (2, 4, 8):
            for beta in (12.5e6, 125e6):
                for b in (4096, 65536, 1 << 20, 16 << 20):
                    t = NetworkModel(ALPHA, beta, profile=truth, shared_cores=2).predict(kind, b, n)
                    ms.append(Measurement(kind, b, n, ALPHA, beta, t, shared_cores=2))
    got = fit_profile(ms, "fitted")
    for kind in COLLECTIVES:
        assert got.costs[kind].step_s == pytest.approx(TERMS_OF[kind][1], rel=1e-4, abs=1e-7), kind
        assert got.costs[kind].crowd_step_s == pytest.approx(CROWD, rel=1e-4), kind


def test_a_profile_without_the_crowd_term_reads_as_zero(tmp_path):
    """Profiles fitted before crowd_step_s existed (workers one per core) stay usable."""
    path = tmp_path / "old.json"
    data = _profile_json()
    assert all("crowd_step_s" not in v for v in data["collectives"].values())
    path.write_text(json.dumps(data))
    assert all(c.crowd_step_s == 0.0 for c in load_profile(str(path)).costs.values())


def test_gloo_broadcast_tree_shape():
    # (hops, tensor-times) to the last receiver: N=3 root sends to 1 and 2 at once; N=5 root to 1, 2, 4
    # (3 units), then 1 to 3 (one more)
    assert [(steps("broadcast", n), wire("broadcast", 1, n)) for n in (2, 3, 4, 5, 8)] == \
        [(1, 1), (1, 2), (2, 3), (2, 4), (3, 6)]


def test_fit_recovers_known_terms():
    truth = _profile()
    ms = []
    for kind in COLLECTIVES:
        for n in (2, 4):
            for beta in (12.5e6, 37.5e6, 125e6):
                for b in (4096, 65536, 1 << 20, 16 << 20):
                    burst = 96 * 1024 if beta < 1e8 else 0.0
                    t = NetworkModel(ALPHA, beta, profile=truth, burst_bytes=burst).predict(kind, b, n)
                    ms.append(Measurement(kind, b, n, ALPHA, beta, t, burst))
    got = fit_profile(ms, "fitted")
    near_zero = {"call_s": 1e-7, "step_s": 1e-7, "link_factor": 1e-4, "pair_factor": 1e-4, "host_s_per_byte": 1e-13}
    for kind in COLLECTIVES:
        for term, want in zip(TERMS, TERMS_OF[kind]):
            assert getattr(got.costs[kind], term) == pytest.approx(want, rel=1e-4, abs=near_zero[term]), (kind, term)


def test_fit_keeps_the_link_at_most_its_rate():
    """Measurements faster than the link (noise, a burst) never give a link_factor below 1."""
    ms = [Measurement("allreduce", b, n, ALPHA, BETA, 0.5 * NetworkModel(ALPHA, BETA).allreduce(b, n))
          for n in (2, 4) for b in (1e5, 1e6, 1e7)]
    assert fit_profile(ms, "fast").costs["allreduce"].link_factor >= 1.0


def test_ideal_is_exactly_the_alpha_beta_model():
    """The default gives bit for bit the numbers every existing result was modelled with."""
    cfg = NetworkCfg(bandwidth_gbps=1.0, latency_us=10.0)
    assert cfg.collectives == "ideal"
    m = NetworkModel.from_cfg(cfg)
    a, b = m.alpha_s, m.beta_Bps
    assert m.profile is None and m.describe()["collectives"] == "ideal"
    for n in (1, 2, 3, 4, 8, 32):
        for nbytes in (8, 4096, 123457, 1 << 20, 97 << 20):
            ar = 0.0 if n == 1 else 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / b
            ag = 0.0 if n == 1 else (n - 1) * a + (n - 1) * nbytes / b
            cnt = 0.0 if n == 1 else (n - 1) * a + (n - 1) * 8 / b
            assert m.allreduce(nbytes, n) == ar and m.allgather(nbytes, n) == ag
            assert m.sparse_allgather(nbytes, n) == [cnt, ag]
    m.calibrate(4e6, 4, 0.05, 2.0)
    assert m.beta_Bps == 2 * 3 / 4 * 4e6 / (2.0 * 0.05 - 6 * a)


def test_committed_gloo_profile_loads_and_is_described():
    m = NetworkModel.from_cfg(NetworkCfg(collectives="gloo-cpu"))
    assert m.profile.name == "gloo-cpu" and set(m.profile.costs) == set(COLLECTIVES)
    d = m.describe()
    assert d["collectives"] == "gloo-cpu" and d["model"] == "collective profile gloo-cpu"
    assert set(d["profile"]) == set(COLLECTIVES)
    for kind in COLLECTIVES:                   # slower than ideal, never faster than the link
        assert m.predict(kind, 16 << 20, 4) >= NetworkModel(m.alpha_s, m.beta_Bps).predict(kind, 16 << 20, 4)


def test_profile_file_round_trips(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(_profile().to_json()))
    got = load_profile(str(path))
    assert got.costs == _profile().costs and got.name == "test" and got.source == str(path)


def _broken(terms_edit) -> dict:
    data = _profile_json()
    terms_edit(data)
    return data


@pytest.mark.parametrize("content,fragment", [
    ("{not json", "cannot be read as JSON"),
    ("[1, 2]", "not a collective profile"),
    (json.dumps({"collectives": {}}), "collective 'allreduce' is missing"),
    (json.dumps(_broken(lambda d: d["collectives"].pop("broadcast"))), "collective 'broadcast' is missing"),
    (json.dumps(_broken(lambda d: d["collectives"]["allgather"].pop("step_s"))), "allgather.step_s is null"),
    (json.dumps(_broken(lambda d: d["collectives"]["allreduce"].update(call_s=-1))), "allreduce.call_s is -1, not"),
    (json.dumps(_broken(lambda d: d["collectives"]["broadcast"].update(link_factor=0))),
     "broadcast.link_factor is 0, not a number > 0"),
    (json.dumps(_broken(lambda d: d["collectives"]["allreduce"].update(host_s_per_byte="fast"))),
     "allreduce.host_s_per_byte is \"fast\""),
])
def test_bad_profile_file_is_one_line(tmp_path, content, fragment):
    """The config check refuses it (before a run or sweep starts); one broken after the check stops
    the run's model with the same line."""
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as checked_e:
        checked(NetworkCfg, {"collectives": str(path)}, "network")
    with pytest.raises(UserError) as e:
        NetworkModel.from_cfg(NetworkCfg(collectives=str(path)))
    for err in (checked_e, e):
        assert fragment in str(err.value) and f"network.collectives={path}: " in str(err.value), str(err.value)
        assert "\n" not in str(err.value)


def test_unknown_profile_name_lists_the_choices():
    with pytest.raises(UserError) as e:
        load_profile("nccl-gpu")
    msg = str(e.value)
    assert "no such profile" in msg and "ideal" in msg and "gloo-cpu" in msg and "\n" not in msg


def test_netval_rerunning_one_setting_keeps_the_others(tmp_path):
    """`--parts steps --step-workers 4` replaces the N = 4 steps rows only: the N = 2 ones and the
    collectives measured before stay in the CSV (they were lost before)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import netval
    out = tmp_path / "nv.csv"
    row = lambda kind, n: {"kind": kind, "workers": n, "rate_mbit": 100.0, "delay_ms": 0.0, "bytes": 4096,  # noqa: E731
                           "measured_s": 0.01}
    netval.write_csv([row("allreduce", 2), row("step_topk10", 2), row("step_topk10", 4), row("step_dense", 4)], out)
    args = netval.parse(["--parts", "steps", "--step-workers", "4", "--step-arms", "topk10", "--rates", "100"])
    kept = netval.kept_rows(args, out, netval.settings(args))
    assert sorted((r["kind"], int(r["workers"])) for r in kept) == \
        [("allreduce", 2), ("step_dense", 4), ("step_topk10", 2)]
