"""GraVAC's configuration and decision core: `GraVACCfg`, `GraVACController` (plain floats, no
tensors: the window logic of gravac/methods/gravac.py's docstring) and the helpers the method
`GraVAC` and the DDP hook `GraVACState` (gravac/hooks/hooks.py) both decide with.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from gravac.core.registry import option
from gravac.core.schema import MethodCfg


@dataclass
class GraVACCfg(MethodCfg):
    """Paper defaults: CF space [10x, 1000x], window 500, omega 1%, epsilon 0.7, exponential policy."""
    cf_min: float = option(10.0, check=lambda v: v >= 1, valid=">= 1", doc="lowest CF of the search (raised as gains allow)")
    cf_max: float = option(1000.0, check=lambda v: v >= 1, valid=">= 1", doc="highest CF the search may reach")
    window: int = option(500, check=lambda v: v >= 1, valid=">= 1", doc="steps between CF decisions")
    step: float = option(2.0, check=lambda v: v > 1, valid="> 1", doc="initial cs: the candidate CF is cf_min x cs")
    epsilon: float = option(0.7, check=lambda v: 0 < v <= 1, valid="in (0, 1]", doc="compression gain a CF must keep to be accepted")
    omega: float = option(0.01, check=lambda v: 0 <= v < 1, valid="in [0, 1)", doc="relative throughput gain that counts as a gain")
    policy: str = option("exponential", choices=("exponential", "geometric"), doc="how cs grows: squares | doubles")
    ewma: float = option(-1.0, check=lambda v: v < 0 or 0 < v <= 1, valid="in (0, 1], or < 0 for N/100")
    reset_step: bool = False             # restart cs at `step` after cf_min is raised
    tcomp: str = option("mean", choices=("mean", "last"))       # T_compression: mean since the window began | last
    grow_if: str = option("always", choices=("always", "accepted"))   # grow cs every window | while accepted
    gain: str = option("paper", choices=("paper", "code"), doc="which gain decides (gravac/methods/gains.py)")
    gain_window: int = option(25, check=lambda v: v >= 1, valid=">= 1")          # gain=code: sliding window
    gain_alpha: float = option(0.05, check=lambda v: 0 < v <= 1, valid="in (0, 1]")   # gain=code: EWMA alpha

    def errors(self, prefix: str) -> list[str]:
        if self.cf_max < self.cf_min:
            return [f"{prefix}.cf_max={self.cf_max} must be >= {prefix}.cf_min={self.cf_min}"]
        return []

def cf_key(cf: float) -> str:
    """Stable text form of a CF for records (10, 20, 62.5, ...)."""
    return f"{cf:.6g}"


@dataclass
class Decision:
    """What the controller decided at one step (parameters are those this step used)."""
    level: str                  # "c" | "min" | "dense"
    cf_sent: float              # nominal CF of the level sent (1 for dense)
    cf_min: float
    cs: float
    cf_c: float
    delta_min: float            # smoothed gains
    delta_c: float
    delta_min_raw: float
    delta_c_raw: float
    t_system: float | None      # samples/s of the previous step (None at the first step)
    window_end: bool            # the window update ran after this step's decision


@dataclass
class ControllerState:
    """Everything the controller carries between steps (for checkpoints)."""
    cf_min: float
    cs: float
    ewma_min: float | None = None
    ewma_c: float | None = None
    settled: bool = False
    settled_cf: float | None = None
    t_compression: dict = field(default_factory=dict)    # cf -> value
    tc_window: dict = field(default_factory=dict)        # cf -> [sum, count] since the window began
    pending: tuple | None = None                         # (cf, delta, samples) of the last step


class GraVACController:
    """GraVAC's decisions from cluster gains and step times alone (see the module docstring)."""

    def __init__(self, cf_min: float, cf_max: float, window: int, step: float, epsilon: float,
                 omega: float, policy: str = "exponential", ewma: float = 0.04,
                 reset_step: bool = False, tcomp: str = "mean", grow_if: str = "always"):
        if policy not in ("exponential", "geometric"):
            raise ValueError(f"policy must be exponential or geometric, got {policy!r}")
        if tcomp not in ("mean", "last"):
            raise ValueError(f"tcomp must be mean or last, got {tcomp!r}")
        if grow_if not in ("always", "accepted"):
            raise ValueError(f"grow_if must be always or accepted, got {grow_if!r}")
        if not (cf_max >= cf_min >= 1 and step > 1 and window >= 1 and 0 < ewma <= 1):
            raise ValueError("GraVAC needs cf_max >= cf_min >= 1, step > 1, window >= 1, 0 < ewma <= 1")
        self.cf_max, self.window, self.step0 = float(cf_max), int(window), float(step)
        self.epsilon, self.omega, self.policy = float(epsilon), float(omega), policy
        self.alpha, self.reset_step, self.tcomp, self.grow_if = float(ewma), bool(reset_step), tcomp, grow_if
        self.s = ControllerState(cf_min=float(cf_min), cs=self._cap(float(cf_min), float(step)))

    # --- read-only views --------------------------------------------------------------------
    @property
    def cf_min(self) -> float:
        return self.s.cf_min

    @property
    def cs(self) -> float:
        return self.s.cs

    @property
    def cf_c(self) -> float:
        return self.s.cf_min * self.s.cs

    @property
    def settled(self) -> bool:
        return self.s.settled

    @property
    def t_compression(self) -> dict:
        return dict(self.s.t_compression)

    # --- the step ---------------------------------------------------------------------------
    def step(self, i: int, delta_min_raw: float, delta_c_raw: float,
             t_iter_prev: float = 0.0, samples: float = 0.0) -> Decision:
        """Decide step i from its raw cluster gains; `t_iter_prev` is the previous step's time.

        Records the previous step's T_compression, smooths the gains, picks the level, and after
        the last step of a window runs the window update (which applies from step i+1 on).
        """
        s = self.s
        t_system = self._record_previous(t_iter_prev)
        if s.cs <= 1:                       # no separate candidate level (cf_min = cf_max)
            delta_c_raw = delta_min_raw
        s.ewma_min = self._smooth(s.ewma_min, delta_min_raw)
        s.ewma_c = self._smooth(s.ewma_c, delta_c_raw) if s.cs > 1 else s.ewma_min
        cf_min, cs, cf_c = s.cf_min, s.cs, self.cf_c
        if s.cs > 1 and s.ewma_c >= self.epsilon:
            level, cf, delta = "c", cf_c, s.ewma_c
        elif s.ewma_min >= self.epsilon:
            level, cf, delta = "min", cf_min, s.ewma_min
        else:
            level, cf, delta = "dense", 1.0, 1.0
        s.pending = (cf, delta, samples)
        window_end = (i + 1) % self.window == 0
        d = Decision(level, cf, cf_min, cs, cf_c, s.ewma_min, s.ewma_c, delta_min_raw, delta_c_raw,
                     t_system, window_end)
        if window_end:
            self.end_window()
        return d

    def _smooth(self, old: float | None, x: float) -> float:
        """EWMA with weight alpha on the new sample; the first sample seeds it."""
        return x if old is None else self.alpha * x + (1 - self.alpha) * old

    def _record_previous(self, t_iter_prev: float) -> float | None:
        """T_compression[cf of the previous step] from its (cluster-wide) step time."""
        s = self.s
        if s.pending is None or not t_iter_prev > 0:
            return None
        cf, delta, samples = s.pending
        s.pending = None
        t_system = samples / t_iter_prev
        value = t_system * delta
        if self.tcomp == "last":
            s.t_compression[cf] = value
        else:
            acc = s.tc_window.setdefault(cf, [0.0, 0])
            acc[0] += value
            acc[1] += 1
            s.t_compression[cf] = acc[0] / acc[1]
        return t_system

    # --- window update ------------------------------------------------------------------------
    def end_window(self) -> None:
        """Saturation check, cf_min raise, cs growth (in that order); see the module docstring."""
        s = self.s
        s.tc_window = {}
        if s.settled:
            return
        best = self.saturated()
        if best is not None:
            self._settle(best)
            return
        cf_c_old, raised = self.cf_c, False
        if s.cs > 1 and s.ewma_min and s.ewma_c is not None \
                and abs(s.ewma_min - s.ewma_c) / s.ewma_min <= self.omega:
            s.cf_min, s.ewma_min, raised = cf_c_old, s.ewma_c, True
        if raised and self.reset_step:
            s.cs = self._cap(s.cf_min, self.step0)
        elif raised or self.grow_if == "always" or (s.ewma_c or 0.0) >= self.epsilon:
            s.cs = self._cap(s.cf_min, self.grow(s.cs))
        if raised or not math.isclose(self.cf_c, cf_c_old):
            s.ewma_c = None                    # a new candidate CF: its EWMA starts afresh

    def grow(self, cs: float) -> float:
        """The policy's next step size: exponential squares, geometric multiplies by `step`."""
        return cs * cs if self.policy == "exponential" else cs * self.step0

    def _cap(self, cf_min: float, cs: float) -> float:
        """cs limited so that cf_min·cs ≤ cf_max (and never below 1)."""
        return max(1.0, min(cs, self.cf_max / cf_min))

    def saturated(self) -> float | None:
        """The lower CF of the two best compressed T_compression values if within ω, else None."""
        cands = sorted(((v, cf) for cf, v in self.s.t_compression.items() if cf > 1), reverse=True)
        if len(cands) < 2:
            return None
        (v1, cf1), (v2, cf2) = cands[:2]
        if v1 <= 0 or (v1 - v2) > self.omega * v1:
            return None
        return min(cf1, cf2)

    def _settle(self, cf: float) -> None:
        """Freeze scaling with `cf` as the candidate CF (cf_min drops to it when lower)."""
        s = self.s
        old_min, old_c = s.cf_min, self.cf_c
        if cf < s.cf_min * (1 + 1e-9):
            s.cf_min, s.cs = cf, 1.0
        else:
            s.cs = self._cap(s.cf_min, cf / s.cf_min)
        if not math.isclose(s.cf_min, old_min):
            s.ewma_min = s.ewma_c if math.isclose(s.cf_min, old_c) else None
        if not math.isclose(self.cf_c, old_c):
            s.ewma_c = None
        s.settled, s.settled_cf = True, cf

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return asdict(self.s)

    def load_state_dict(self, state: dict) -> None:
        st = dict(state)
        st["pending"] = tuple(st["pending"]) if st.get("pending") is not None else None
        st["t_compression"] = {float(k): v for k, v in st["t_compression"].items()}
        st["tc_window"] = {float(k): list(v) for k, v in st["tc_window"].items()}
        self.s = ControllerState(**st)


def controller_for(cfg: GraVACCfg, world: int) -> GraVACController:
    """The controller a GraVAC config describes for `world` workers (the method and the DDP hook
    share it): EWMA weight `ewma`, or N/100 when negative, or 1 with gain=code (whose sliding
    window already smooths)."""
    alpha = 1.0 if cfg.gain == "code" else cfg.ewma if cfg.ewma > 0 else min(1.0, world / 100)
    return GraVACController(cfg.cf_min, cfg.cf_max, cfg.window, cfg.step, cfg.epsilon, cfg.omega, cfg.policy,
                            alpha, reset_step=cfg.reset_step, tcomp=cfg.tcomp, grow_if=cfg.grow_if)


def ratio(num: float, den: float) -> float:
    """A gain from cluster sums; 1 when there is nothing to compress (den 0)."""
    return num / den if den > 0 else 1.0


def sq_norm(x: torch.Tensor) -> float:
    """||x||² as a Python float."""
    x = x.reshape(-1)
    return float(torch.dot(x, x))
