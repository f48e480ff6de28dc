"""Names and addresses of an emulated cluster: everything derives from (prefix, hosts, subnet).

Only these names and addresses are ever created, shaped or deleted. Example::

    lay = Layout("nntorus", hosts=2, subnet="10.213.0.0/24")
    lay.host_names     # ['nntorus-h0', 'nntorus-h1']  (namespace name == hostname)
    lay.switch         # 'nntorus-sw': namespace with the bridge, where mpirun runs
    lay.host_address(1)  # '10.213.0.3'; the switch's own address is '10.213.0.1'
"""
import ipaddress
import re

MAX_PREFIX = 9  # keeps namespace names short: PREFIX + "-h" + index


class Layout:
    """Names and addresses for ``hosts`` emulated hosts under ``prefix`` in ``subnet``."""

    def __init__(self, prefix, hosts, subnet):
        if not re.fullmatch(r"[a-z][a-z0-9]{0,%d}" % (MAX_PREFIX - 1), prefix):
            raise ValueError(f"prefix {prefix!r} must be 1-{MAX_PREFIX} lowercase letters/digits "
                             "starting with a letter")
        self.prefix = prefix
        self.subnet = ipaddress.ip_network(subnet, strict=True)
        if self.subnet.version != 4:
            raise ValueError(f"subnet {subnet} must be IPv4, e.g. 10.213.0.0/24")
        capacity = self.subnet.num_addresses - 3  # network, broadcast, bridge
        if not 1 <= hosts <= min(capacity, 999):
            raise ValueError(f"hosts={hosts} out of range: 1..{min(capacity, 999)} "
                             f"for subnet {subnet}; use a larger subnet or fewer hosts")
        self.hosts = hosts

    @property
    def switch(self):
        """The namespace holding the bridge ``br0``; mpirun runs there, like on a login node."""
        return f"{self.prefix}-sw"

    @property
    def switch_address(self):
        """The switch namespace's address on the bridge (mpirun's out-of-band channel)."""
        return str(self.subnet.network_address + 1)

    @property
    def namespaces(self):
        return [self.switch] + self.host_names

    @property
    def host_names(self):
        """Hostname of each emulated host; also its network namespace name."""
        return [self.host_name(i) for i in range(self.hosts)]

    def host_name(self, index):
        return f"{self.prefix}-h{index}"

    def host_address(self, index):
        return str(self.subnet.network_address + 2 + index)

    def switch_port(self, index):
        """The switch-side end of host ``index``'s veth (its peer is ``eth0`` inside the host)."""
        return f"h{index}"

    def hosts_file_lines(self):
        """``/etc/hosts`` lines that resolve every emulated host name."""
        return [f"{self.host_address(i)}\t{name}" for i, name in enumerate(self.host_names)]

    def owns_namespace(self, name):
        """Whether ``name`` is a namespace this prefix creates (for cleaning up leftovers)."""
        return re.fullmatch(re.escape(self.prefix) + r"-(h\d+|sw)", name) is not None
