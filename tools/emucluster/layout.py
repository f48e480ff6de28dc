"""Names and addresses of an emulated cluster: everything derives from (prefix, hosts, subnet).

Only these names and addresses are ever created, shaped or deleted. Example::

    lay = Layout("nntorus", hosts=2, subnet="10.213.0.0/24")
    lay.host_names     # ['nntorus-h0', 'nntorus-h1']  (namespace name == hostname)
    lay.host_address(1)  # '10.213.0.3'; the bridge (where mpirun runs) is '10.213.0.1'
"""
import ipaddress
import re

MAX_PREFIX = 9  # Linux interface names hold 15 characters: PREFIX + "-br" / "-h" + index


class Layout:
    """Names and addresses for ``hosts`` emulated hosts under ``prefix`` in ``subnet``."""

    def __init__(self, prefix, hosts, subnet):
        if not re.fullmatch(r"[a-z][a-z0-9]{0,%d}" % (MAX_PREFIX - 1), prefix):
            raise ValueError(f"prefix {prefix!r} must be 1-{MAX_PREFIX} lowercase letters/digits "
                             "starting with a letter (interface names are limited to 15 chars)")
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
    def bridge(self):
        """The bridge's interface name in the root namespace."""
        return f"{self.prefix}-br"

    @property
    def bridge_address(self):
        """The root namespace's address on the bridge (mpirun's out-of-band channel)."""
        return str(self.subnet.network_address + 1)

    @property
    def host_names(self):
        """Hostname of each emulated host; also its network namespace name."""
        return [self.host_name(i) for i in range(self.hosts)]

    def host_name(self, index):
        return f"{self.prefix}-h{index}"

    def host_address(self, index):
        return str(self.subnet.network_address + 2 + index)

    def bridge_port(self, index):
        """The bridge-side end of host ``index``'s veth (its peer is ``eth0`` inside the host)."""
        return f"{self.prefix}-h{index}"

    def hosts_file_lines(self):
        """``/etc/hosts`` lines that resolve every emulated host name."""
        return [f"{self.host_address(i)}\t{name}" for i, name in enumerate(self.host_names)]

    def owns_namespace(self, name):
        """Whether ``name`` is a namespace this prefix creates (for cleaning up leftovers)."""
        return re.fullmatch(re.escape(self.prefix) + r"-h\d+", name) is not None
