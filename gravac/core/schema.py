"""Typed configuration objects: the plain dataclasses every part of the library receives.

Hydra composes YAML from conf/; gravac.config.compose turns that into these objects in one place. Each
pluggable section (model, dataset, compressor, method) is the base class below or, for a chosen
plug-in, the config subclass it registered with its own options (e.g. GraVACCfg). Valid ranges and
choices are declared on the fields (`option`), so validation and its messages derive from here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gravac.core.registry import option

__all__ = ["ModelCfg", "DatasetCfg", "CompressorCfg", "MethodCfg", "ClusterCfg", "NetworkCfg", "ClockCfg", "TrainCfg",
           "LoggerCfg", "ExperimentCfg", "RunConfig", "SECTIONS", "PLUGGABLE"]


@dataclass
class ModelCfg:
    """Which network to build; paper presets also set dataset/train values in their YAML."""
    name: str = "resnet_mini"


@dataclass
class DatasetCfg:
    """Where the data lives and which split evaluates; each dataset adds its own options."""
    name: str = "synthetic"
    root: str = "./data"                # default from $GRAVAC_DATA_DIR (see config.base_node)
    cache_dir: str = ""                 # decoded-array cache; "" -> $GRAVAC_CACHE_DIR or ~/.cache/gravac-bench
    eval_split: str = option("test", choices=("test", "valid"))


@dataclass
class CompressorCfg:
    """Options every compressor has; a compressor's own options subclass this (see gravac/core/registry.py)."""
    name: str = "none"
    cf: float = option(100.0, check=lambda v: v >= 1, valid=">= 1 (CF = dense size / sent size)",
                       doc="compression factor: dense size / sent size (10 keeps 10%)")
    granularity: str = option("layer", choices=("layer", "flat"), doc="compress per parameter tensor | one flat tensor")
    error_feedback: bool = True


@dataclass
class MethodCfg:
    """Adaptivity policy or scheduler; each method adds its own options."""
    name: str = "dense"


@dataclass
class ClusterCfg:
    """How workers are realised: sim = virtual workers in one process, ddp = torch.distributed."""
    backend: str = option("sim", choices=("sim", "ddp"))
    workers: int = option(4, check=lambda v: v >= 1, valid=">= 1")
    dist_backend: str = option("auto", choices=("auto", "gloo", "nccl"))   # auto: nccl with CUDA, else gloo
    device: str = option("cpu", choices=("cpu", "cuda"))
    threads: int = option(1, check=lambda v: v >= 0, valid=">= 0",
                          doc="intra-op threads per process; 0: this process's share of its cores (cores / local "
                              "processes; SLURM's cpus_per_task). 1 by default: it keeps its speed beside other work, "
                              "and single runs and sweep jobs then compute (and profile) alike")
    timeout_s: float = option(60.0, check=lambda v: v > 0, valid="> 0")   # a collective waiting longer fails the run
    max_memory_gb: float = option(0.0, check=lambda v: v >= 0, valid=">= 0")  # sim refuses above; 0 -> 80% of RAM
    numerics: str = option("native", choices=("native", "portable"),
                           doc="native: this host's fastest kernels | portable: the same bits on any x86-64 host, "
                               "one thread per process, about 3x slower compute (gravac/cluster/numerics.py)")

    def errors(self, prefix: str) -> list[str]:
        if self.numerics != "portable":
            return []
        if self.device != "cpu":
            return [f"{prefix}.numerics=portable pins CPU kernels only (cuDNN/cuBLAS determinism is not covered): "
                    f"use {prefix}.device=cpu or {prefix}.numerics=native"]
        if self.threads > 1:
            return [f"{prefix}.numerics=portable runs one thread per process (a reduction split over threads rounds "
                    f"by the split), but {prefix}.threads={self.threads}: drop {prefix}.threads or set it to 1"]
        return []


@dataclass
class NetworkCfg:
    """Model of the cluster network used for modelled communication time: link latency and bandwidth,
    and how each collective costs on them (`collectives`, gravac/cluster/netmodel.py)."""
    name: str = "10gbps"
    enabled: bool = True
    bandwidth_gbps: float = option(10.0, check=lambda v: v > 0, valid="> 0")      # beta, Gbit/s
    latency_us: float = option(10.0, check=lambda v: v >= 0, valid=">= 0")        # alpha, microseconds per message
    comm_ratio: float = option(0.0, check=lambda v: v >= 0, valid=">= 0")         # > 0: dense all-reduce = ratio x compute
    time_source: str = option("auto", choices=("auto", "modelled", "wall"))       # step time GraVAC sees
    overlap: bool = True                # modelled step time overlaps communication with backward (DDP-like)
    bucket_cap_mb: float = option(25.0, check=lambda v: v > 0, valid="> 0")      # DDP's bucket size
    first_bucket_mb: float = option(1.0, check=lambda v: v > 0, valid="> 0")     # DDP's smaller first bucket
    buckets: int = option(0, check=lambda v: v >= 0, valid=">= 0")              # > 0: cap = model size / buckets
    collectives: str = option("ideal", check=lambda v: v != "", valid="ideal, a profile name or a profile file",
                              doc="collective cost model: ideal (alpha-beta ring, assumed) | gloo-cpu (fitted to gloo "
                                  "over real links, results/reference/collectives) | the path of a profile file")
    shared_cores: int = option(0, check=lambda v: v >= 0, valid=">= 0",
                               doc="0: each worker has its own machine | C: all workers share C cores (a one-machine "
                                   "run, as bench/netval.py's links); a profile's crowd_step_s then applies")

    def errors(self, prefix: str) -> list[str]:
        """A profile other than ideal must be a readable, complete file (gravac/core/collectives.py)."""
        from gravac.core.collectives import profile_problem
        problem = profile_problem(self.collectives) if self.collectives else None
        return [f"{prefix}.collectives={self.collectives}: {problem}"] if problem else []


@dataclass
class ClockCfg:
    """Where modelled step times come from (gravac/cluster/profile.py): a device profile and compression
    costs measured once and cached (reproducible), or each step's own measurement."""
    compute: str = option("profile", choices=("profile", "measured"))     # forward + backward time
    compress: str = option("profile", choices=("profile", "measured"))    # compression operations
    compute_s: float = option(0.0, check=lambda v: v >= 0, valid=">= 0")  # > 0: given fwd+bwd s/step (e.g. a GPU's)
    repeats: int = option(5, check=lambda v: v >= 1, valid=">= 1")       # calibration repetitions (median)
    cache_dir: str = ""                 # "" -> $GRAVAC_CACHE_DIR/profiles, else ~/.cache/gravac-bench/profiles
    machine: str = option("auto", doc="auto: the committed study device (results/reference/device) when it holds "
                          "this run's profile and the run is CPU, 1 thread, native numerics, else this host | \"\": "
                          "this host | NAME: a named device in clock.cache_dir (read-only)")
                                        # "" keys this host by torch, device, threads and CPU; a NAME pins profile
                                        # and costs to a stated device whatever host reads them, and refuses (not
                                        # measures) what it lacks; auto borrows from this host what the study
                                        # device lacks in op costs, for the run only (gravac/cluster/clock.py)
    extend_machine: bool = False        # true: measure on this host what clock.machine lacks (or a new name's
                                        # everything) and add it to that device's files, printing each addition
    record_ready: bool = True           # write ready.jsonl: every worker's gradient-ready offsets per step

    def errors(self, prefix: str) -> list[str]:
        if self.extend_machine and self.machine in ("", "auto"):
            return [f"{prefix}.extend_machine=true adds to a named device: set {prefix}.machine=NAME too "
                    "(this host's own cache adds what it lacks without it)"]
        return []


@dataclass
class TrainCfg:
    """Optimisation, length of the run, evaluation and target."""
    batch_size: int = option(32, check=lambda v: v >= 1, valid=">= 1")          # per worker
    lr: float = option(0.1, check=lambda v: v > 0, valid="> 0")
    momentum: float = option(0.9, check=lambda v: 0 <= v < 1, valid="in [0, 1)")
    weight_decay: float = option(1e-4, check=lambda v: v >= 0, valid=">= 0")
    nesterov: bool = False
    milestones: list = option(check=lambda v: all(isinstance(m, int) and m >= 1 for m in v),
                              valid="a list of step numbers >= 1", factory=list)   # lr *= gamma at each
    gamma: float = option(0.1, check=lambda v: 0 < v <= 1, valid="in (0, 1]")
    warmup_steps: int = option(0, check=lambda v: v >= 0, valid=">= 0")   # linear lr warm-up; 0 -> none
    steps: int = option(300, check=lambda v: v >= 1, valid=">= 1")              # total steps; epochs > 0 overrides
    epochs: float = option(0.0, check=lambda v: v >= 0, valid=">= 0")
    eval_every: int = option(100, check=lambda v: v >= 1, valid=">= 1")         # steps between evaluations (+ at the end)
    eval_batch_size: int = option(256, check=lambda v: v >= 1, valid=">= 1")    # LM evaluates min(this, 10) sequences
    target_metric: str = option("top1", choices=("top1", "top5", "perplexity"))
    target: float = option(0.0, check=lambda v: v >= 0, valid=">= 0")          # 0: none; top-k as a fraction
    grad_clip: float = option(0.0, check=lambda v: v >= 0, valid=">= 0")       # max grad norm; 0 -> off
    seed: int = 0
    checkpoint_every: int = option(0, check=lambda v: v >= 0, valid=">= 0 (0 = only when stopped)")


@dataclass
class LoggerCfg:
    """Progress display and optional experiment tracking (only rank 0 logs)."""
    name: str = option("none", choices=("none", "wandb"))
    progress: bool = option(True, doc="show progress: a bar on a terminal, else a plain line every progress_every_s")
    progress_every_s: float = option(30.0, check=lambda v: v >= 0, valid=">= 0",
                                     doc="seconds between the plain progress lines written to a log file (0: every step)")
    project: str = "gravac-bench"
    mode: str = option("offline", choices=("offline", "online", "disabled"))   # wandb mode
    entity: str = ""


#: Longest folder name, in bytes, of the usual Linux filesystems (ext4, xfs, btrfs, tmpfs).
NAME_MAX = 255
_COMPONENT = "one folder name: no '/' or '\\', not '.' or '..' (results stay under experiment.results_root)"


def _one_component(v) -> bool:
    """A single path component, so a run folder can never land outside the results root."""
    return isinstance(v, str) and v not in (".", "..") and not any(c in v for c in "/\\\0")


@dataclass
class ExperimentCfg:
    """Names the run and where its results go."""
    name: str = option("default", check=lambda v: v != "" and _one_component(v), valid=_COMPONENT)
    results_root: str = "results/runs"
    run_id: str = option("", check=lambda v: v == "" or _one_component(v), valid=_COMPONENT)  # "" -> generated
    resume: str = ""                    # a run folder to continue from its latest checkpoint
    tags: list = field(default_factory=list)

    def errors(self, prefix: str) -> list[str]:
        """name and run_id become folder names: the filesystem takes at most NAME_MAX bytes each."""
        for key in ("name", "run_id"):
            n = len(getattr(self, key).encode())
            if n > NAME_MAX:
                return [f"{prefix}.{key} is {n} bytes long, too long for a folder name (at most {NAME_MAX} "
                        f"bytes, UTF-8): choose a shorter {prefix}.{key}"]
        return []


@dataclass
class RunConfig:
    """Everything one run needs, built once from Hydra's composed config."""
    model: ModelCfg = field(default_factory=ModelCfg)
    dataset: DatasetCfg = field(default_factory=DatasetCfg)
    compressor: CompressorCfg = field(default_factory=CompressorCfg)
    method: MethodCfg = field(default_factory=MethodCfg)
    cluster: ClusterCfg = field(default_factory=ClusterCfg)
    network: NetworkCfg = field(default_factory=NetworkCfg)
    clock: ClockCfg = field(default_factory=ClockCfg)
    train: TrainCfg = field(default_factory=TrainCfg)
    logger: LoggerCfg = field(default_factory=LoggerCfg)
    experiment: ExperimentCfg = field(default_factory=ExperimentCfg)


#: Sections whose class depends on the chosen plug-in (section name == registry kind).
PLUGGABLE = ("model", "dataset", "compressor", "method")
#: Every section and its base class.
SECTIONS = {"model": ModelCfg, "dataset": DatasetCfg, "compressor": CompressorCfg, "method": MethodCfg,
            "cluster": ClusterCfg, "network": NetworkCfg, "clock": ClockCfg, "train": TrainCfg, "logger": LoggerCfg,
            "experiment": ExperimentCfg}
