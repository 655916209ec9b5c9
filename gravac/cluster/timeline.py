"""When a step ends if communication overlaps backward as in DDP: a small schedule per step.

A step is: forward (F), then backward, during which each parameter's gradient becomes ready at
its profiled offset; the method's `Piece`s (a DDP bucket, a MergeComp group, or the whole model)
each wait for their last gradient, are compressed on the compute resource and sent as one or more
messages over ONE link, first come first served, each message costing its own alpha-beta time
(latency included). Then the averaged gradient is applied by the optimizer. The step's time is
the makespan.

Compute resource: like kernels queued on one stream, a piece's compression runs as soon as its
last gradient is ready and delays the rest of backward by its duration. Link: a message starts
when the link is free and its piece is compressed. Aggregation of the received payloads is not
modelled (it is small next to the collectives; state it where it matters).

A single piece that needs every gradient degenerates to the serial sum
forward + backward + compression + communication + optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Piece:
    """Something a method sends: it needs the gradients of `params` (flat parameter indices, or
    None for all), `compress_s` on the compute resource, then `messages` (seconds each) in order."""
    params: list[int] | None
    compress_s: float
    messages: list[float] = field(default_factory=list)


@dataclass
class Schedule:
    """The step's makespan and what determined it."""
    step_s: float
    backward_end_s: float            # compute resource done (backward plus inserted compression)
    link_end_s: float                # last message delivered
    exposed_comm_s: float            # communication not hidden behind compute


def schedule(forward_s: float, backward_s: float, ready_s: list[float], optimizer_s: float,
             pieces: list[Piece]) -> Schedule:
    """Makespan of one step (see the module docstring); times in seconds from the step's start."""
    order = sorted(pieces, key=lambda p: _ready(p, ready_s, backward_s))
    shift = 0.0                      # backward delayed by compression inserted so far
    compute_free = forward_s
    done: list[tuple[float, Piece]] = []
    for p in order:
        start = max(forward_s + _ready(p, ready_s, backward_s) + shift, compute_free)
        compute_free = start + p.compress_s
        shift += p.compress_s
        done.append((compute_free, p))
    backward_end = max(forward_s + backward_s + shift, compute_free)
    link = 0.0
    for ready, p in sorted(done, key=lambda d: d[0]):
        for m in p.messages:
            link = max(link, ready) + m
            ready = link
    end = max(backward_end, link)
    return Schedule(step_s=end + optimizer_s, backward_end_s=backward_end, link_end_s=link,
                    exposed_comm_s=max(0.0, link - backward_end))


def on_profile(profile, compute_s: float, pieces: list[Piece]) -> Schedule:
    """schedule() on a DeviceProfile; without one (unknown ready times) every piece waits for the
    end of a `compute_s` backward, the serial step. For methods that plan on the timeline."""
    if profile is None:
        return schedule(0.0, compute_s, [], 0.0, pieces)
    return schedule(profile.forward_s, profile.backward_s, profile.ready_s, profile.optimizer_s, pieces)


def _ready(p: Piece, ready_s: list[float], backward_s: float) -> float:
    """Offset from backward's start at which every gradient the piece needs is ready."""
    if p.params is None or not ready_s:
        return backward_s
    return min(backward_s, max(ready_s[i] for i in p.params))


def buckets(sizes: list[int], order: list[int], element_bytes: int, cap_mb: float,
            first_cap_mb: float) -> list[list[int]]:
    """DDP's bucket assignment: parameters in backward `order`, a new bucket whenever adding the
    next one would exceed the cap (`first_cap_mb` for the first bucket, as DDP's 1 MB one, then
    `cap_mb`); a parameter larger than the cap gets a bucket of its own."""
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in order:
        b = sizes[i] * element_bytes
        cap = (first_cap_mb if not out else cap_mb) * 2**20
        if cur and used + b > cap:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += b
    if cur:
        out.append(cur)
    return out
