"""Error feedback: what a worker did not send is kept and added to its next gradient.

One instance per worker per compression level. ``compensate(g)`` returns g + residual;
``update(compensated, sent)`` sets residual = compensated − sent.dense() without building the
dense tensor (a copy, then a subtraction at the sent indices), so
``compensated == sent.dense() + residual`` holds bitwise for selection compressors.

With ``momentum=m > 0`` it is DGC's momentum correction: u = m·u + g, v = v + u, compensate returns
v; update keeps v − sent as the residual and zeroes u at the sent indices (momentum factor
masking). A dense payload leaves a zero residual (and, with momentum, a zero u).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Payload


class ErrorFeedback:
    """Residual memory (optionally with DGC momentum correction) for one flat gradient."""

    def __init__(self, numel: int, *, device=None, dtype=torch.float32, enabled: bool = True,
                 momentum: float = 0.0) -> None:
        if numel < 1:
            raise ValueError(f"ErrorFeedback needs numel >= 1, got {numel}")
        if not (0.0 <= momentum < 1.0):
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.numel = int(numel)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        self.enabled = bool(enabled)
        self.momentum = float(momentum)
        self._residual = torch.zeros(numel, device=self.device, dtype=dtype) if enabled else None
        self._u = torch.zeros(numel, device=self.device, dtype=dtype) if enabled and momentum > 0 else None

    @property
    def residual(self) -> Tensor:
        """The residual v (zeros when disabled; a fresh tensor then)."""
        if self._residual is None:
            return torch.zeros(self.numel, device=self.device, dtype=self.dtype)
        return self._residual

    @property
    def nbytes(self) -> int:
        """Bytes of state held (residual, plus the momentum buffer when momentum > 0)."""
        return sum(t.numel() * t.element_size() for t in (self._residual, self._u) if t is not None)

    @torch.no_grad()
    def compensate(self, grad: Tensor) -> Tensor:
        """grad + residual as a new tensor (disabled: grad itself). Updates u when momentum > 0."""
        if grad.shape != (self.numel,):
            raise ValueError(f"ErrorFeedback expects a flat gradient of {self.numel} elements, got {tuple(grad.shape)}")
        if not self.enabled:
            return grad
        if self._u is not None:
            self._u.mul_(self.momentum).add_(grad)
            return self._residual + self._u
        return grad + self._residual

    @torch.no_grad()
    def update(self, compensated: Tensor, sent: Payload) -> None:
        """residual = compensated − sent.dense(); with momentum also u[sent] = 0."""
        if not self.enabled:
            return
        if sent.numel != self.numel:
            raise ValueError(f"payload numel {sent.numel} != ErrorFeedback numel {self.numel}")
        if sent.indices is None:
            self._residual.copy_(compensated).sub_(sent.values)
            if self._u is not None:
                self._u.zero_()
            return
        self._residual.copy_(compensated)
        self._residual.index_add_(0, sent.indices, sent.values, alpha=-1)
        if self._u is not None:
            self._u.index_fill_(0, sent.indices, 0)

    def reset(self) -> None:
        """Forget everything accumulated (residual and momentum)."""
        for t in (self._residual, self._u):
            if t is not None:
                t.zero_()

    def state_dict(self) -> dict:
        """Checkpointable state (tensors are copies on their own device)."""
        return {"numel": self.numel, "enabled": self.enabled, "momentum": self.momentum,
                "residual": None if self._residual is None else self._residual.clone(),
                "momentum_buffer": None if self._u is None else self._u.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`; numel, enabled and momentum must match."""
        for key in ("numel", "enabled", "momentum"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"ErrorFeedback state has {key}={state.get(key)!r}, expected {getattr(self, key)!r}")
        for name, key in (("_residual", "residual"), ("_u", "momentum_buffer")):
            mine = getattr(self, name)
            if mine is not None:
                mine.copy_(state[key].to(device=mine.device, dtype=mine.dtype))
