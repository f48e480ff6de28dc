"""Shape the emulated links with `tc`: a token-bucket rate limit on both ends of every veth.

The switch-side end limits traffic *to* a host, the in-namespace ``eth0`` traffic *from* it,
so each host has a full-duplex link of ``rate`` in each direction, like a NIC on a switch.
Delay and loss need the kernel's ``netem`` qdisc; where it is missing they are refused with a
message (the rate limit works without it). Example::

    shape(lay, LinkSpec(rate="1gbit"))         # tbf on 2 * hosts devices
    LinkSpec(rate="1gbit").bits_per_second     # 1e9
"""
import re

from .net import ClusterError, run

AUTO_BURST_SECONDS = 2e-3  # bucket depth in seconds of line rate, see LinkSpec._burst
UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(text):
    """Bits per second of a tc-style rate ("1gbit", "100mbit", "2.5gbit"); None for "none"."""
    value = str(text).strip().lower()
    if value in ("", "none", "0", "unlimited"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)bit", value)
    if not match:
        raise ValueError(f"rate {text!r} is not a tc rate: use e.g. 100mbit, 1gbit, 10gbit or none")
    return float(match.group(1)) * UNITS[match.group(2)]


def parse_bytes(text):
    """Bytes of "64k", "4m", "1500" (binary multiples: k = 1024)."""
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(text).strip().lower())
    if not match:
        raise ValueError(f"size {text!r} is not a byte count: use e.g. 1500, 64k, 4m")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2) or " ")


class LinkSpec:
    """What each host link looks like.

    rate: per direction, tc syntax or "none"; burst: token-bucket depth in bytes (how much may
    leave at line speed after an idle period); queue_ms: the qdisc queue in milliseconds of
    ``rate`` (packets beyond it are dropped, which TCP reads as congestion); delay_ms, loss_pct:
    netem one-way delay and loss (0 = off).
    """

    def __init__(self, rate="none", burst="auto", queue_ms=50.0, delay_ms=0.0, loss_pct=0.0):
        self.rate = rate
        self.bits_per_second = parse_rate(rate)
        self.burst_bytes = self._burst(burst)
        if queue_ms <= 0:
            raise ValueError(f"queue_ms={queue_ms} must be > 0 (e.g. 50)")
        self.queue_ms = queue_ms
        if delay_ms < 0 or not 0 <= loss_pct < 100:
            raise ValueError(f"delay_ms={delay_ms} must be >= 0 and loss_pct={loss_pct} "
                             "in [0, 100)")
        self.delay_ms, self.loss_pct = delay_ms, loss_pct

    def _burst(self, burst):
        if burst != "auto":
            return parse_bytes(burst)
        if self.bits_per_second is None:
            return None
        # tbf sends only when its timer fires; on a loaded VM that is ~0.1-1 ms late, and tokens
        # beyond the bucket are lost meanwhile. A 15-64 KiB bucket therefore gave half the rate
        # (measured); 2 ms of line rate, and at least one 64 KiB GSO packet, gave >= 94 %.
        return max(64 * 1024, int(self.bits_per_second / 8 * AUTO_BURST_SECONDS))

    @property
    def needs_netem(self):
        return self.delay_ms > 0 or self.loss_pct > 0

    def describe(self):
        parts = [f"rate {self.rate}"]
        if self.bits_per_second:
            parts.append(f"burst {self.burst_bytes} B, queue {self.queue_ms:g} ms")
        if self.needs_netem:
            parts.append(f"delay {self.delay_ms:g} ms, loss {self.loss_pct:g} %")
        return ", ".join(parts)


def netem_available(namespace, device):
    """Whether the kernel has netem, probed on ``device`` (one of ours) and undone at once."""
    tc = ["tc", "-n", namespace, "qdisc"]
    if run(tc + ["add", "dev", device, "root", "netem", "delay", "0ms"], check=False).returncode:
        return False
    run(tc + ["del", "dev", device, "root"], check=False)
    return True


def shape(layout, spec):
    """Apply ``spec`` to both ends of every host link of ``layout``."""
    if spec.needs_netem and not netem_available(layout.switch, layout.switch_port(0)):
        raise ClusterError("delay/loss need the kernel's netem qdisc (sch_netem), which this "
                           "kernel lacks: drop --delay/--loss or use a kernel with "
                           "CONFIG_NET_SCH_NETEM")
    for index in range(layout.hosts):
        _shape_device(["tc", "-n", layout.switch], layout.switch_port(index), spec)
        _shape_device(["tc", "-n", layout.host_name(index)], "eth0", spec)


def _shape_device(tc, device, spec):
    run(tc + ["qdisc", "del", "dev", device, "root"], check=False)
    parent = ["root"]
    if spec.needs_netem:
        run(tc + ["qdisc", "add", "dev", device, "root", "handle", "1:", "netem",
                  "delay", f"{spec.delay_ms}ms", "loss", f"{spec.loss_pct}%"])
        parent = ["parent", "1:1"]
    if spec.bits_per_second:
        queue_bytes = int(spec.bits_per_second / 8 * spec.queue_ms / 1000) + spec.burst_bytes
        run(tc + ["qdisc", "add", "dev", device] + parent + ["handle", "10:", "tbf",
                  "rate", spec.rate, "burst", str(spec.burst_bytes), "limit", str(queue_bytes)])


def qdisc_report(layout):
    """`tc -s qdisc` of every shaped device (sent bytes, drops, overlimits), for diagnosis."""
    lines = []
    for index in range(layout.hosts):
        for tc, device in ((["tc", "-n", layout.switch], layout.switch_port(index)),
                           (["tc", "-n", layout.host_name(index)], "eth0")):
            out = run(tc + ["-s", "qdisc", "show", "dev", device], check=False).stdout.strip()
            lines.append(f"{layout.host_name(index)} {device}: {out}")
    return "\n".join(lines)
