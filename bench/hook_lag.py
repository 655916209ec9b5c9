"""GraVAC as a DDP hook (one-step lag) against the in-loop GraVAC method, same seed and data.

Two gloo processes train a mini model twice from the same weights on the same batches: once with
DistributedDataParallel and `gravac.hooks.gravac_hook` (decides at the last bucket for the next
step), once with the project's GraVAC Method on the flat gradient through `DistGroup` (decides
from the step's own gains, as bench/run.py does). Both compress per parameter tensor with Top-k
(deterministic, so seeds play no part) and see measured wall time as T_system. Prints the steps
whose level (c / min / dense) or CF sent differ, the floats sent and the final losses of both.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _setup(args):
    """The run config (model, data, GraVAC options), the dataset and this arm's fresh model."""
    from gravac.config.compose import base_node, build_config
    from gravac.data import load_dataset
    node = base_node()
    node["dataset"].update(name="synthetic", image_size=args.image_size, root="./data")
    node["model"].update(name=args.model)
    node["network"].update(enabled=False)
    node["method"] = dict(name="gravac", **_gravac_opts(args))
    node["compressor"] = dict(name="topk", granularity="layer")
    cfg = build_config(node)
    ds = load_dataset(cfg.dataset)
    return cfg, ds


def _gravac_opts(args) -> dict:
    return dict(cf_min=args.cf_min, cf_max=args.cf_max, window=args.window, epsilon=args.epsilon, ewma=args.ewma,
                gain=args.gain)


def _model(cfg, ds):
    import torch

    from gravac.models import build_model
    torch.manual_seed(0)
    return build_model(cfg.model, ds.num_classes, ds.task)


def _hook_arm(rank: int, world: int, cfg, ds, args) -> list[dict]:
    """DDP + gravac_hook: per step the loss, the level and CF sent, the floats sent."""
    import torch
    import torch.nn.functional as F

    from gravac.hooks import GraVACState, gravac_hook
    model = torch.nn.parallel.DistributedDataParallel(_model(cfg, ds))
    state = GraVACState(None, compressor="topk", batch_size=args.batch, **_gravac_opts(args))
    model.register_comm_hook(state, gravac_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader, out = ds.train_loader(rank, world, args.batch, 0), []
    for _ in range(args.steps):
        x, y = loader.next_batch()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        s = state.last
        out.append({"loss": loss.item(), "level": s["level"], "cf": s["cf_sent"], "floats": s["floats_sent"]})
    return out


def _loop_arm(rank: int, world: int, cfg, ds, args) -> list[dict]:
    """The GraVAC Method on the flat local gradient, as the training loop drives it."""
    import torch
    import torch.nn.functional as F

    from gravac.cluster.comm import DistGroup
    from gravac.methods import StepContext, build_method
    from gravac.cluster.netmodel import NetworkModel
    model = _model(cfg, ds)
    params = list(model.parameters())
    method = build_method(cfg, DistGroup(NetworkModel.from_cfg(cfg.network), torch.device("cpu")),
                          [p.numel() for p in params], torch.device("cpu"))
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    loader, out, prev = ds.train_loader(rank, world, args.batch, 0), [], None
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = loader.next_batch()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        res = method.step([flat], StepContext(step=step, epoch=0.0, lr=args.lr, lr_decayed=False,
                                              compute_s=time.perf_counter() - t0, samples=world * args.batch,
                                              prev_step_s=prev))
        torch.nn.utils.vector_to_parameters(res.grad, [p.grad for p in params])
        opt.step()
        prev = time.perf_counter() - t0
        e = res.extra
        cf = {"c": e["cf_c"], "min": e["cf_min"]}.get(e["level"], 1.0)
        out.append({"loss": loss.item(), "level": e["level"], "cf": cf, "floats": res.floats_sent})
    return out


def _worker(rank: int, world: int, init: str, args, out: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    cfg, ds = _setup(args)
    res = {"hook": _hook_arm(rank, world, cfg, ds, args), "loop": _loop_arm(rank, world, cfg, ds, args)}
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def report(res: dict) -> list[str]:
    """The comparison's lines: differing decisions, floats sent, final losses."""
    hook, loop = res["hook"], res["loop"]
    n = len(hook)
    level_diff = [i for i in range(n) if hook[i]["level"] != loop[i]["level"]]
    cf_diff = [i for i in range(n) if hook[i]["cf"] != loop[i]["cf"]]
    lagged = sum(1 for i in range(1, n) if hook[i]["level"] == loop[i - 1]["level"])
    tail = max(1, n // 10)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return [
        f"{n} steps: level differs at {len(level_diff)} steps, CF sent at {len(cf_diff)} "
        f"(first: {cf_diff[:8]}); the hook's level equals the loop's of the step before at {lagged} of {n - 1}",
        f"floats sent per worker: hook {sum(h['floats'] for h in hook):.4g}, loop {sum(x['floats'] for x in loop):.4g}",
        f"final loss: hook {hook[-1]['loss']:.4f}, loop {loop[-1]['loss']:.4f}; mean of the last {tail} steps: "
        f"hook {mean([h['loss'] for h in hook[-tail:]]):.4f}, loop {mean([x['loss'] for x in loop[-tail:]]):.4f}",
        "levels (hook / loop), one letter per step (c, m = cf_min, d = dense):",
        "  " + "".join(h["level"][0] for h in hook),
        "  " + "".join(x["level"][0] for x in loop),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet_mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--cf-min", type=float, default=10.0)
    p.add_argument("--cf-max", type=float, default=1000.0)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--epsilon", type=float, default=0.4)
    p.add_argument("--ewma", type=float, default=0.2, help="EWMA weight of a new gain sample (< 0: N/100)")
    p.add_argument("--gain", choices=("paper", "code"), default="paper", help="which gain decides")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lag.json")
        mp.start_processes(_worker, args=(2, f"file://{tmp}/store", args, out), nprocs=2, start_method="spawn")
        res = json.loads(Path(out).read_text())
    print(f"GraVAC hook vs in-loop, 2 gloo processes, {args.model}, batch {args.batch}, Top-k per tensor, "
          f"[{args.cf_min:g}x, {args.cf_max:g}x], window {args.window}, epsilon {args.epsilon:g}, ewma {args.ewma:g}, {args.gain} gain")
    for line in report(res):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
