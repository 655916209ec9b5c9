"""Typed configuration objects: the plain dataclasses every part of the library receives.

Hydra composes YAML from conf/; gravac.config turns that into these objects in one place, checking
types and ranges, so the library never does `cfg.x.y` lookups on a DictConfig.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DatasetCfg:
    """Where the data lives and how it is served to workers."""
    name: str = "synthetic"             # synthetic | cifar10 | cifar100 | ptb
    root: str = "./data"                # default from $GRAVAC_DATA_DIR (set in conf/dataset/*.yaml)
    cache_dir: str = ""                 # decoded-array cache; "" -> $GRAVAC_CACHE_DIR or ~/.cache/gravac-bench
    download: bool = True               # try torchvision's download when files are missing
    augment: bool = True                # random crop (pad 4) + horizontal flip for image datasets
    eval_split: str = "test"            # test | valid (valid only for ptb)
    bptt: int = 35                      # ptb: sequence length of one training step
    # synthetic only: a deterministic, learnable image-classification task generated from `seed`
    num_classes: int = 10
    image_size: int = 16
    train_size: int = 8192
    test_size: int = 2048
    noise: float = 1.0
    seed: int = 0


@dataclass
class ModelCfg:
    """Which network to build; paper presets also set dataset/train values in their YAML."""
    name: str = "resnet_mini"           # resnet101 | vgg16 | lstm | resnet_mini | vgg_mini | lstm_mini
    width: int = 16                     # base channel width of the mini CNNs
    blocks: int = 3                     # resnet_mini residual blocks per stage (3 = ResNet-20, 1 = ResNet-8)
    # LSTM language model
    embed_size: int = 1500
    hidden_size: int = 1500
    num_layers: int = 2
    dropout: float = 0.65
    tie_weights: bool = False


@dataclass
class CompressorCfg:
    """Which compressor a method uses and its options (ignored by method=dense)."""
    name: str = "none"                  # none | topk | dgc | redsync | randomk
    cf: float = 100.0                   # static CF (dense size / sent size); adaptive methods use their own range
    granularity: str = "layer"          # layer (per parameter tensor) | flat (one tensor per model)
    error_feedback: bool = True
    # dgc
    sample_ratio: float = 0.01
    momentum_correction: bool = False
    warmup_epochs: float = 0.0
    # redsync
    max_iters: int = 20
    # randomk
    shared_indices: bool = True


@dataclass
class MethodCfg:
    """Adaptivity policy. Fields not used by the chosen method are ignored (and validated anyway)."""
    name: str = "dense"                 # dense | static | accordion | gravac
    # gravac (paper defaults)
    cf_min: float = 10.0
    cf_max: float = 1000.0
    window: int = 500
    step: float = 2.0                   # initial step size cs: candidate CF is cf_min * cs
    epsilon: float = 0.7
    omega: float = 0.01
    policy: str = "exponential"         # exponential (cs squares) | geometric (cs doubles)
    ewma: float = -1.0                  # smoothing factor of the gains; < 0 -> N/100 (the paper's talk)
    reset_step: bool = False            # restart cs at `step` after cf_min is raised
    tcomp: str = "mean"                 # T_compression entry: mean since the last window | last sample
    grow_if: str = "always"             # grow cs every window (paper) | only while the candidate is accepted
    # accordion
    cf_low: float = 1.5
    cf_high: float = 1000.0
    switch_freq: int = 10               # epochs between regime checks (10 CNNs, 5 LSTMs)
    eta: float = 0.5
    accumulate: str = "local"           # gradient whose epoch norm is compared: local (rank 0's, as the
                                        # public code) | averaged (after communication)


@dataclass
class ClusterCfg:
    """How workers are realised: sim = virtual workers in one process, ddp = torch.distributed."""
    backend: str = "sim"                # sim | ddp
    workers: int = 4
    dist_backend: str = "auto"          # auto (nccl with CUDA, else gloo) | gloo | nccl
    device: str = "cpu"                 # cpu | cuda
    threads: int = 0                    # torch threads per process; 0 -> cores / local processes
    timeout_s: float = 60.0             # a collective waiting longer than this fails the run
    max_memory_gb: float = 0.0          # sim refuses to start above this estimate; 0 -> 80% of RAM


@dataclass
class NetworkCfg:
    """Alpha-beta model of the cluster network used for modelled communication time."""
    name: str = "10gbps"
    enabled: bool = True
    bandwidth_gbps: float = 10.0        # beta, Gbit/s
    latency_us: float = 10.0            # alpha, microseconds per message
    comm_ratio: float = 0.0             # > 0: set bandwidth so a dense all-reduce costs ratio x compute time
    calibrate_steps: int = 5            # steps of measured compute used to set the bandwidth for comm_ratio
    time_source: str = "auto"           # step time GraVAC sees: auto (modelled if enabled) | modelled | wall


@dataclass
class TrainCfg:
    """Optimisation, length of the run, evaluation and target."""
    batch_size: int = 32                # per worker
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    nesterov: bool = False
    milestones: list = field(default_factory=list)   # steps at which lr /= gamma
    gamma: float = 0.1
    steps: int = 300                    # total steps; epochs > 0 overrides
    epochs: float = 0.0
    eval_every: int = 100               # steps between evaluations (and at the end)
    eval_batch_size: int = 256         # images per eval batch; LM evaluates min(this, 10) sequences
    target_metric: str = "top1"         # top1 | top5 | perplexity
    target: float = 0.0                 # 0 -> no target; top-k as a fraction (0.8 = 80%)
    grad_clip: float = 0.0              # max grad norm (LSTM); 0 -> off
    seed: int = 0
    checkpoint_every: int = 0           # steps between checkpoints; 0 -> only when stopped by a signal


@dataclass
class LoggerCfg:
    """Progress display and optional experiment tracking (only rank 0 logs)."""
    name: str = "none"                  # none | wandb
    progress: bool = True
    project: str = "gravac-bench"
    mode: str = "offline"               # wandb mode: offline | online | disabled
    entity: str = ""


@dataclass
class ExperimentCfg:
    """Names the run and where its results go."""
    name: str = "default"
    results_root: str = "results/runs"
    run_id: str = ""                    # "" -> generated (time, method, compressor, pid, random)
    resume: str = ""                    # a run folder to continue from its latest checkpoint
    tags: list = field(default_factory=list)


@dataclass
class RunConfig:
    """Everything one run needs, built once from Hydra's composed config."""
    model: ModelCfg = field(default_factory=ModelCfg)
    dataset: DatasetCfg = field(default_factory=DatasetCfg)
    compressor: CompressorCfg = field(default_factory=CompressorCfg)
    method: MethodCfg = field(default_factory=MethodCfg)
    cluster: ClusterCfg = field(default_factory=ClusterCfg)
    network: NetworkCfg = field(default_factory=NetworkCfg)
    train: TrainCfg = field(default_factory=TrainCfg)
    logger: LoggerCfg = field(default_factory=LoggerCfg)
    experiment: ExperimentCfg = field(default_factory=ExperimentCfg)
