"""A cluster of kv_server members for the fleet tests (test_cluster_placement.py,
test_prefill_decode.py): members on hosts of their own, an etcd, the processes of an
inference instance on a host, and the placement check of issue 50.

Hosts are network namespaces joined by a bridge when the test may make them (root and a
working `ip netns`, as test/netns/netns_test.py): each host has its own address and
stack, its processes are entered into its namespace, etcd and the test itself sit on
the bridge, and a host can be cut off (its link taken down: its members stop answering
without resetting connections, as a host that lost power).  Otherwise every host is
127.0.0.1 (`Network.loopback_why` says why; KV_FLEET_LOOPBACK=1 asks for it) and a cut
host is killed instead.

Members listen on their host's address; any address but loopback needs a token, so
every member and client here carries one."""
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request

import kvengine

BUILD = os.path.join(os.path.dirname(kvengine.__file__), "..", "..")
KV_SERVER = os.path.join(BUILD, "kv_server")
ETCD = next((p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)),
            None)
WAIT_S = 20  # a bound on start-up waits, not a timing check
CLONE_NEWNET = 0x40000000


def free_port():
    """A loopback port free a moment ago, drawn below the kernel's ephemeral range, so
    that no parallel test's outgoing connection (which takes an ephemeral port) lands
    on it before the server binds it (as test/test_util.h's FreePort)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        if low <= 11000:
            break
        port = random.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as s:  # no room below the range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(*args, check=True):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()))
    return p


def netns_unusable():
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root"
    try:
        p = _sh("ip", "netns", "list", check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return "no usable ip(8): %s" % e
    return None if p.returncode == 0 else "ip netns fails: %s" % p.stderr.strip()


class Host:
    """A host of the test: a network namespace with one address, or loopback."""

    def __init__(self, name, address, netns=None, link=None):
        self.name, self.address, self.netns, self._link = name, address, netns, link

    def command(self, argv):
        return (["ip", "netns", "exec", self.netns] if self.netns else []) + list(argv)

    def cut(self):
        """Takes the host off the network: its peers' packets go unanswered (no reset).
        False on loopback, where a host cannot be cut."""
        if not self.netns:
            return False
        _sh("ip", "netns", "exec", self.netns, "ip", "link", "set", self._link, "down")
        return True


class Network:
    """n hosts: network namespaces on a bridge (10.231.S.1..n, the bridge .254), or
    loopback.  A context manager; closing deletes the namespaces and the bridge."""

    def __init__(self, n, use_netns=True):
        if not use_netns:
            self.loopback_why = "not asked for"
        elif os.environ.get("KV_FLEET_LOOPBACK"):
            self.loopback_why = "KV_FLEET_LOOPBACK is set"
        else:
            self.loopback_why = netns_unusable()
        self._made, self._links, self._bridge = [], [], None
        if self.loopback_why is None:
            try:
                self._make(n)
            except RuntimeError as e:
                self.close()
                self.loopback_why = "cannot build the bridge here (%s)" % e
        if self.loopback_why is not None:
            self.hosts = [Host("host%d" % i, "127.0.0.1") for i in range(n)]
            self.gateway = "127.0.0.1"

    _networks = 0  # made by this process: each gets names and a subnet of its own

    def _make(self, n):
        Network._networks += 1
        pid = os.getpid() % 100000
        tag = "%d-%d" % (pid, Network._networks % 100)  # interface names: 15 bytes at most
        # A /24 no other bridge of this host uses (parallel runs, other tests).
        used = _sh("ip", "-4", "-o", "addr", "show").stdout
        subnet = next(s for s in ((pid + Network._networks + i) % 200 + 10 for i in range(200))
                      if " 10.231.%d." % s not in used)
        self._bridge = "kvbr%s" % tag
        _sh("ip", "link", "add", self._bridge, "type", "bridge")
        self.gateway = "10.231.%d.254" % subnet
        _sh("ip", "addr", "add", self.gateway + "/24", "dev", self._bridge)
        _sh("ip", "link", "set", self._bridge, "up")
        self.hosts = []
        for i in range(n):
            ns, inside, outside = "kvh%s_%d" % (tag, i), "kvi%s_%d" % (tag, i), "kvo%s_%d" % (tag, i)
            _sh("ip", "netns", "add", ns)
            self._made.append(ns)
            _sh("ip", "link", "add", inside, "type", "veth", "peer", "name", outside)
            self._links.append(outside)
            _sh("ip", "link", "set", inside, "netns", ns)
            _sh("ip", "link", "set", outside, "master", self._bridge)
            _sh("ip", "link", "set", outside, "up")
            address = "10.231.%d.%d" % (subnet, i + 1)
            for argv in (("ip", "addr", "add", address + "/24", "dev", inside),
                         ("ip", "link", "set", inside, "up"), ("ip", "link", "set", "lo", "up")):
                _sh("ip", "netns", "exec", ns, *argv)
            self.hosts.append(Host("host%d" % i, address, ns, inside))

    @property
    def namespaces(self):
        return self.loopback_why is None

    def close(self):
        # A namespace outlives its deletion while the kernel holds sockets of it (a
        # connection to a cut host retransmitting): the pairs go at once, from this end.
        for link in self._links:
            _sh("ip", "link", "del", link, check=False)
        for ns in self._made:
            _sh("ip", "netns", "del", ns, check=False)
        self._made, self._links = [], []
        if self._bridge:
            _sh("ip", "link", "del", self._bridge, check=False)
            self._bridge = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def enter_netns(netns):
    """Moves the calling process (its one thread: call it first thing) into netns."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/var/run/netns/" + netns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns(%s)" % netns)
    finally:
        os.close(fd)


def host_of(pid):
    """The network namespace (of Network's) process pid runs in; None for the test's."""
    net = os.stat("/proc/%d/ns/net" % pid).st_ino
    if net == os.stat("/proc/self/ns/net").st_ino:
        return None
    names = os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else []
    return next((n for n in names if os.stat("/var/run/netns/" + n).st_ino == net), "?")


def on_host(conn, netns, target, *args):
    """A spawned process's target (spawned.Spawned) that runs target(conn, *args) on a
    host: in its network namespace, when it has one."""
    if netns:
        enter_netns(netns)
    target(conn, *args)


class Etcd:
    """A private single-node etcd listening on address (the bridge, or loopback)."""

    def __init__(self, root, address="127.0.0.1"):
        self.address = "%s:%d" % (address, free_port())
        peer = "http://%s:%d" % (address, free_port())
        client = "http://" + self.address
        self._log = open(os.path.join(root, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [ETCD, "--name=test", "--data-dir=" + os.path.join(root, "etcd"),
             "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
             "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
             "--initial-cluster=test=" + peer], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(client + "/health", timeout=1) as r:
                    if b"true" in r.read():
                        return
            except OSError:
                pass
            assert self.proc.poll() is None, "etcd exited; see etcd.log"
            assert time.monotonic() < deadline, "etcd never answered; see etcd.log"
            time.sleep(0.1)

    def url(self, prefix):
        return "etcd://%s/%s" % (self.address, prefix)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self._log.close()


class Member:
    """A kv_server of the cluster on a host: serving peers on TCP at the host's address,
    and the host's processes on a local socket.  Static peers (`peers`) or etcd
    (`cluster`, an etcd:// URL)."""

    OPTIONS = ("memory_capacity_bytes=64MiB,prefault_memory=false,ssd_capacity_bytes=0,"
               "log_level=error,peer_mode=sharded,peer_timeout_ms=1000,"
               "cluster_lease_ttl_ms=2000")

    def __init__(self, root, index, host, port, replicas, token, peers=None, cluster=None):
        self.host, self.index, self.token = host, index, token
        self.endpoint = "%s:%d" % (host.address, port)
        self.socket = os.path.join(root, "m%d.sock" % index)
        self._argv = host.command(
            [KV_SERVER, "--db=" + os.path.join(root, "m%d" % index), "--listen=" + self.endpoint,
             "--transport=tcp", "--local_listen=" + self.socket, "--auth_token_file=" + token,
             "--options=" + self.OPTIONS + ",cluster_replicas=%d" % replicas]
            + (["--cluster=" + cluster] if cluster else []))
        # Static peers reach kv_server through the environment: --options splits at commas.
        self._env = dict(os.environ, KVENGINE_PEERS=",".join(peers)) if peers else None
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self._argv, stdout=subprocess.PIPE, env=self._env)
        line = self.proc.stdout.readline().decode()
        assert "serving" in line, "member %d did not start: %r" % (self.index, line)

    def sees(self):
        """How many other members this one routes over (kvengine.peers), or -1."""
        try:
            with kvengine.attach(self.socket, apply_environment=False) as db:
                text = db.get_property("kvengine.peers")
        except kvengine.Error:
            return -1
        for line in text.splitlines():
            if line.startswith("peers: "):
                return int(line.split()[1])
        return -1

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
            self.proc.stdout.close()

    stop = kill


class Cluster:
    """Members on the hosts of a Network, one per host (static peers, or etcd with the
    etcd on the bridge), each started with cluster_replicas=replicas; every member routes
    over all the others when the constructor returns."""

    def __init__(self, root, network, replicas, on_etcd):
        self.root, self.network, self.replicas = root, network, replicas
        self.token = os.path.join(root, "token")
        with open(self.token, "w") as f:
            f.write("fleet-test-token\n")
        self.etcd = Etcd(root, network.gateway) if on_etcd else None
        ports = [free_port() for _ in network.hosts]
        endpoints = ["%s:%d" % (h.address, p) for h, p in zip(network.hosts, ports)]
        self.members = []
        try:
            for i, (host, port) in enumerate(zip(network.hosts, ports)):
                self.members.append(Member(
                    root, i, host, port, replicas, self.token,
                    peers=None if on_etcd else endpoints,
                    cluster=self.etcd.url("fleet") if on_etcd else None))
            deadline = time.monotonic() + WAIT_S
            while any(m.sees() != len(ports) - 1 for m in self.members):
                assert time.monotonic() < deadline, "the members never saw each other"
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise

    @property
    def endpoints(self):
        return [m.endpoint for m in self.members]

    def client_options(self, replicas=None):
        """Options of a DB that is a client of the cluster (no member)."""
        o = dict(peer_mode="sharded", peer_auth_token_file=self.token, peer_timeout_ms=2000,
                 cluster_replicas=replicas or self.replicas, memory_capacity_bytes="16MiB",
                 prefault_memory=False, ssd_capacity_bytes=0, apply_environment=False)
        if self.etcd:
            o["cluster"] = self.etcd.url("fleet")
        else:
            o["peers"] = ",".join(self.endpoints)
        return o

    def holders(self, keys, members=None):
        """Which members hold each key in their own tiers: a set of endpoints per key.
        Each member is asked alone (a client whose one peer it is: a peer's request is
        answered from the member's own tiers, never routed again)."""
        held = [set() for _ in keys]
        for m in members or self.members:
            path = os.path.join(self.root, "ask_%d" % m.index)
            with kvengine.DB(path, peers=m.endpoint, peer_mode="sharded",
                             peer_auth_token_file=self.token, memory_capacity_bytes="16MiB",
                             prefault_memory=False, ssd_capacity_bytes=0,
                             apply_environment=False) as one:
                for i, r in enumerate(one.batch_is_exist(list(keys))):
                    assert r >= 0, "member %s could not be asked: %s" % (
                        m.endpoint, kvengine.error_name(r))
                    if r == 1:
                        held[i].add(m.endpoint)
        return held

    def misplaced(self, keys):
        """The placement check of issue 50: each key on exactly its R rendezvous owners.
        Returns a line per key that is not (empty when all are)."""
        out = []
        for key, held in zip(keys, self.holders(keys)):
            owners = kvengine.rendezvous_owners(key, self.endpoints, self.replicas)
            if held != set(owners):
                out.append("%s is on %s, its owners are %s" % (
                    kvengine.printable_key(key), sorted(held), owners))
        return out

    def close(self):
        for m in self.members:
            m.kill()
        if self.etcd:
            self.etcd.stop()
