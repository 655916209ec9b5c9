"""A real, rate-limited network on one machine: N network namespaces joined by veth pairs to a bridge.

Each host namespace has one veth end with address 10.<net>.0.<i+1>; the other end sits on a Linux
bridge in a switch namespace. Both ends are shaped by `tc tbf rate R` (so every host has a
full-duplex link of R, like a port on a switch), and the host end also by `netem delay` when a
latency is asked for (one-way latency = delay). Names are unique per run and everything is
deleted on every exit path (context manager, plus SIGINT/SIGTERM turned into exceptions by the
caller). Needs root and iproute2; `missing()` says what is absent, in one line.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field


def missing() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or skip the network validation)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian: apt-get install iproute2)"
    return None


def has_netem() -> bool:
    """Whether this kernel has the netem qdisc (latency); some container kernels lack it."""
    tag = secrets.token_hex(3)
    ns = f"gvb{tag}t"
    try:
        _sh("ip", "netns", "add", ns)
        r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                            "delay", "1ms"], capture_output=True, text=True)
        return r.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _sh(*args: str) -> None:
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {r.stderr.strip() or r.stdout.strip()}")


def burst_bytes(rate_mbit: float) -> int:
    """tbf's bucket: at least a 64 KB GSO segment, and ~4 ms of traffic at the rate."""
    return max(96 * 1024, int(rate_mbit * 1e6 / 8 * 0.004))


@dataclass
class Netns:
    """N hosts on one shaped bridge. Use as a context manager; `run(i, argv)` starts a process in host i."""
    hosts: int
    rate_mbit: float
    delay_ms: float = 0.0
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: int = field(default_factory=lambda: 16 + secrets.randbelow(200))
    created: list = field(default_factory=list)

    def ns(self, i: int) -> str:
        return f"gvb{self.tag}h{i}"

    @property
    def switch(self) -> str:
        return f"gvb{self.tag}sw"

    def addr(self, i: int) -> str:
        return f"10.{self.subnet}.0.{i + 1}"

    def ifname(self, i: int) -> str:
        """The host's interface (gloo's GLOO_SOCKET_IFNAME)."""
        return f"gv{self.tag}h{i}"

    def __enter__(self) -> "Netns":
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _sh("ip", "netns", "add", name)
        self.created.append(name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")

    def _shape(self, ns: str, dev: str, delay_ms: float) -> None:
        burst, rate = burst_bytes(self.rate_mbit), f"{self.rate_mbit}mbit"
        if delay_ms > 0:
            _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:",
                "netem", "delay", f"{delay_ms}ms", "limit", "100000")
            parent = ["parent", "1:1", "handle", "10:"]
        else:
            parent = ["root", "handle", "10:"]
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, *parent, "tbf", "rate", rate,
            "burst", str(burst), "latency", "400ms")

    def _create(self) -> None:
        self._add_ns(self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.hosts):
            ns, host, port = self.ns(i), self.ifname(i), f"gv{self.tag}s{i}"
            self._add_ns(ns)
            _sh("ip", "link", "add", host, "netns", ns, "type", "veth", "peer", "name", port,
                "netns", self.switch)
            _sh("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", host)
            _sh("ip", "-n", ns, "link", "set", host, "up")
            self._shape(ns, host, self.delay_ms)
            self._shape(self.switch, port, 0.0)

    def close(self) -> None:
        """Delete every namespace this object made (their veths and qdiscs go with them)."""
        while self.created:
            subprocess.run(["ip", "netns", "del", self.created.pop()], capture_output=True)

    def popen(self, i: int, argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Start `argv` inside host i, with gloo bound to the host's interface."""
        env = {**(env or os.environ), "GLOO_SOCKET_IFNAME": self.ifname(i)}
        return subprocess.Popen(["ip", "netns", "exec", self.ns(i), *argv], env=env, **kw)

    def describe(self) -> dict:
        return {"hosts": self.hosts, "rate_mbit": self.rate_mbit, "delay_ms": self.delay_ms,
                "burst_bytes": burst_bytes(self.rate_mbit), "topology": "veth pairs to one bridge, tbf both ways"}
