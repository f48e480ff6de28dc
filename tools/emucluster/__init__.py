"""An emulated multi-host cluster on one machine, for measuring collectives where links differ.

K emulated hosts are network namespaces, each with its own hostname (UTS namespace) and one
veth link to a bridge; `tc` rate-limits both ends of every link (one qdisc per direction).
Open MPI runs across them through an ssh "agent" that enters the target host's namespace, so
ranks on one emulated host share memory and ranks on different hosts talk TCP over the shaped
links. Run as root from the repository root::

    .venv/bin/python -m tools.emucluster exec --hosts 2 --ranks-per-host 4 --rate 1gbit \\
        -- .venv/bin/python tools/allreduce_bench.py --sizes 64K,1M,100M

Modules: ``layout`` (names and addresses), ``net`` (namespaces, bridge, veths),
``shaping`` (tc), ``launch`` (hostfile, agent, mpirun), ``cli`` (subcommands), ``profile``
(the cost-model profile of an emulated cluster, for training on it).
"""
