"""Write a simulate.Platform as a SimGrid platform (XML, DTD 4.1): the flow engine's links,
capacities and latencies, in a zone per host and per rack, and the spine between racks.

docs/simulation.md gives the zones and where the latencies sit.
"""


class _PlatformXml:
    """The XML elements of one simulate.Platform: its link ids, capacities and latency halves."""

    def __init__(self, platform):
        self.p, self.net, self.faults = platform, platform.net, platform.faults
        self.names, self.caps = platform.names, [float(c) for c in platform.capacity[:-1]]
        self.multi = platform.racks > 1
        self.intra = self.net.intra.latency_s / platform.share

    def half(self, latency, rank):   # a rank's share of a route's latency; the straggler's is more
        return latency * (self.faults.slowdown - 0.5 if rank == self.faults.straggler else 0.5)

    def link(self, index, latency=0.0):
        return (f'<link id="{self.names[index]}" bandwidth="{self.caps[index]!r}Bps" '
                f'latency="{latency!r}s"/>')

    @staticmethod
    def wire(name, latency):   # latency only: never limits a rate
        return (f'<link id="{name}" bandwidth="1e30Bps" latency="{latency!r}s" '
                f'sharing_policy="FATPIPE"/>')

    @staticmethod
    def route(tag, src, dst, links, gw=None):
        gws = f' gw_src="{gw[0]}" gw_dst="{gw[1]}"' if gw else ""
        ctn = "".join(f'<link_ctn id="{name}"/>' for name in links)
        return f'<{tag} src="{src}" dst="{dst}"{gws} symmetrical="NO">{ctn}</{tag}>'

    def host_zone(self, h):
        """Host h's zone: its ranks, routers, ports, bus and the routes among its ranks."""
        p, names, route, multi = self.p, self.names, self.route, self.multi
        ranks = range(h * p.g, min((h + 1) * p.g, p.ranks))
        out = [f'<zone id="h{h}" routing="Full">']
        out += [f'<host id="r{r}" speed="1f"/>' for r in ranks]
        out.append(f'<router id="g{h}"/>' + (f'<router id="x{h}"/>' if multi else ""))
        for r in ranks:
            out += [self.link(p.port_out + r, self.half(self.intra, r)),
                    self.link(p.port_in + r, self.half(self.intra, r)),
                    self.wire(f"lo[{r}]", self.half(self.net.inter.latency_s, r))]
            if multi:
                out.append(self.wire(f"xlo[{r}]", self.half(self.net.spine.latency_s, r)))
        out.append(self.link(p.bus + h))
        for r in ranks:
            out += [route("route", f"r{r}", f"r{s}", (names[p.port_out + r], names[p.bus + h],
                                                      names[p.port_in + s]))
                    for s in ranks if s != r]
            out += [route("route", f"r{r}", f"g{h}", (f"lo[{r}]",)),
                    route("route", f"g{h}", f"r{r}", (f"lo[{r}]",))]
            if multi:
                out += [route("route", f"r{r}", f"x{h}", (f"xlo[{r}]",)),
                        route("route", f"x{h}", f"r{r}", (f"xlo[{r}]",))]
        out.append("</zone>")
        return out

    def rack_zone(self, rack):
        """Rack ``rack``'s zone: its host zones, NICs, host-to-host and spine routes."""
        p, names, route, multi = self.p, self.names, self.route, self.multi
        hosts = range(rack * p.per_rack, min((rack + 1) * p.per_rack, p.hosts))
        out = [f'<zone id="rack{rack}" routing="Full">']
        for h in hosts:
            out += self.host_zone(h)
        if multi:
            out.append(f'<zone id="s{rack}" routing="Full"><router id="rg{rack}"/></zone>')
        for h in hosts:
            out += [self.link(p.nic_out + h), self.link(p.nic_in + h)]
        for a in hosts:
            out += [route("zoneRoute", f"h{a}", f"h{b}", (names[p.nic_out + a],
                                                          names[p.nic_in + b]), (f"g{a}", f"g{b}"))
                    for b in hosts if b != a]
            if multi:
                out += [route("zoneRoute", f"h{a}", f"s{rack}", (names[p.nic_out + a],),
                              (f"x{a}", f"rg{rack}")),
                        route("zoneRoute", f"s{rack}", f"h{a}", (names[p.nic_in + a],),
                              (f"rg{rack}", f"x{a}"))]
        out.append("</zone>")
        return out

    def spine(self):
        """The racks' up and down links and the rack-to-rack routes over them."""
        p, names, racks = self.p, self.names, range(self.p.racks)
        out = [self.link(p.up + k) for k in racks] + [self.link(p.down + k) for k in racks]
        out += [self.route("zoneRoute", f"rack{a}", f"rack{b}",
                           (names[p.up + a], names[p.down + b]), (f"rg{a}", f"rg{b}"))
                for a in racks for b in racks if a != b]
        return out


def platform_xml(platform):
    """SimGrid platform (XML, DTD 4.1) of a simulate.Platform (docs/simulation.md: its zones
    and where the latencies sit)."""
    xml = _PlatformXml(platform)
    out = ['<?xml version="1.0"?>',
           '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
           '<platform version="4.1">', '<zone id="top" routing="Full">']
    for rack in range(platform.racks):
        out += xml.rack_zone(rack)
    if xml.multi:
        out += xml.spine()
    out += ["</zone>", "</platform>", ""]
    return "\n".join(out)
