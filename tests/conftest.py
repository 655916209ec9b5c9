"""Shared test helpers: composing the project's Hydra config and running bench/run.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def compose(overrides: list[str] | None = None):
    """The composed DictConfig for `overrides`, exactly as bench/run.py would see it."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from gravac.config.compose import register_base
    register_base()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides or [])


def make_run(**sections):
    """A checked RunConfig from plain per-section values, e.g. make_run(method=dict(name="gravac"))."""
    from gravac.config.compose import build_config
    return build_config(sections)


def plugin_cfg(kind: str, name: str, **values):
    """The registered config class of plug-in `name` filled with `values`, unchecked (so tests of
    the builders' own errors still reach them); an unknown name gets the kind's base class."""
    from gravac.config.plugins import registries
    from gravac.core.schema import SECTIONS
    reg = registries()[kind]
    cls = reg[name].config if name in reg else SECTIONS[kind]
    return cls(name=name, **values)


def model_cfg(name: str, **values):
    return plugin_cfg("model", name, **values)


def dataset_cfg(name: str, **values):
    return plugin_cfg("dataset", name, **values)


def ctrl_c_reaches(*_) -> None:
    """Popen's preexec_fn for a run a test stops with SIGINT: the child takes Ctrl-C as a terminal's
    does even when pytest itself was started in the background (`cmd &` in a script starts it with
    SIGINT ignored, the child inherits that, and Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(args: list[str], timeout: float = 600, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run `python bench/run.py ARGS` in a subprocess and capture its output."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=cwd or ROOT)


def failure(r: subprocess.CompletedProcess, tail: int = 3000) -> str:
    """What a failed CLI run said, for an assertion message: each worker rank's own error block
    (in a ddp run the rank that failed first can be pushed out of a plain tail by the peer it broke)
    and the last `tail` characters of stderr."""
    lines = r.stderr.splitlines()
    starts = [i for i, line in enumerate(lines)
              if line.startswith(("worker rank ", "error: worker rank "))]
    blocks = ["\n".join(lines[i:i + 40])[:1500] for i in starts]
    end = r.stderr[-tail:]
    head = [b for b in blocks if b not in end]
    return "\n...\n".join([*head, end]) if head else end


def run_cli_many(jobs: list[dict], workers: int = 2) -> list[subprocess.CompletedProcess]:
    """run_cli(**job) for every job, `workers` at a time (the machine has 2 cores; most of a short
    CLI run is Python and torch start-up), results in the jobs' order."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: run_cli(**job), jobs))


def data_dir(name: str) -> Path:
    """$GRAVAC_DATA_DIR/<name>, or skip the test saying why."""
    root = os.environ.get("GRAVAC_DATA_DIR")
    if not root:
        pytest.skip(f"GRAVAC_DATA_DIR is not set; point it at a folder holding {name}/ to run this test")
    path = Path(root) / name
    if not path.exists():
        pytest.skip(f"{path} does not exist; put {name} there (see README, Data) to run this test")
    return path


def _gloo_child(work, rank: int, world: int, tmp: str) -> None:
    """A spawned rank: join the gloo group (file:// rendezvous in tmp), run work(rank), save its result,
    or its traceback for the parent to show."""
    import traceback
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        result = work(rank)
        torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
        dist.barrier()                  # nobody tears gloo down while a peer is still inside it
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(tmp, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    # Skip interpreter teardown, as the suite's own workers do (gravac/run/launch.py: _leave): gloo's
    # threads destroyed there aborted ranks whose work had finished (exit -6) under load.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def gloo_ranks(work, tmp: Path, world: int = 2, timeout: float = 240) -> list:
    """Each rank's result of work(rank) (a module-level function) run in `world` spawned processes joined
    in one gloo group; workers that hang are killed, and failures show the workers' tracebacks."""
    import torch
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_gloo_child, args=(work, r, world, str(tmp)), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
        p.join(5)
    errors = "".join(f.read_text() for f in sorted(tmp.glob("*.err")))
    assert not hung, f"gloo workers hung for {timeout} s and were killed\n{errors}"
    assert all(p.exitcode == 0 for p in procs), f"gloo workers failed: {[p.exitcode for p in procs]}\n{errors}"
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the figures a test drew and kept (to inspect them) once it ends: pyplot keeps every
    open figure for the whole process, and past 20 it warns in whichever later test opens one."""
    yield
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")
