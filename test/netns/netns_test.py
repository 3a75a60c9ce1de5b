#!/usr/bin/env python3
"""Server and client in two network namespaces joined by a veth pair (issue 7).

  netns_test.py KV_SERVER KV_BENCH

A kv_server listens on its namespace's veth address (so with an auth token: it is not
loopback); kv_bench in the other namespace writes and reads values through it with
bytes verified, a wrong token is refused, and SIGTERM stops the server with exit 0.
Needs root and a working `ip netns`; otherwise exits 77 (CTest: skipped) with a message.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def sh(*args, check_rc=True):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def can_use_netns():
    if os.geteuid() != 0:
        return "not root"
    try:
        p = sh("ip", "netns", "list", check_rc=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"no usable ip(8): {e}"
    if p.returncode != 0:
        return f"ip netns does not work here: {p.stderr.strip()}"
    return None


def wait_listening(ns, port, deadline):
    # Probe from inside the server's namespace: connect to the veth address.
    while time.time() < deadline:
        p = sh("ip", "netns", "exec", ns, sys.executable, "-c",
               "import socket,sys; s=socket.socket(); s.settimeout(0.5); "
               f"sys.exit(s.connect_ex(('10.231.7.1', {port})))", check_rc=False)
        if p.returncode == 0:
            return True
        time.sleep(0.1)
    return False


def main():
    kv_server, kv_bench = sys.argv[1], sys.argv[2]
    why = can_use_netns()
    if why:
        print(f"SKIPPED: network-namespace test needs root and ip netns ({why})")
        return SKIP
    tag = str(os.getpid() % 100000)
    ns_a, ns_b = f"kvsrv{tag}", f"kvcli{tag}"
    veth_a, veth_b = f"kva{tag}", f"kvb{tag}"
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            try:
                sh("ip", "netns", "add", ns_a)
                sh("ip", "netns", "add", ns_b)
                sh("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
                sh("ip", "link", "set", veth_a, "netns", ns_a)
                sh("ip", "link", "set", veth_b, "netns", ns_b)
                for ns, dev, addr in ((ns_a, veth_a, "10.231.7.1/24"),
                                      (ns_b, veth_b, "10.231.7.2/24")):
                    sh("ip", "netns", "exec", ns, "ip", "addr", "add", addr, "dev", dev)
                    sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
                    sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            except RuntimeError as e:
                print(f"SKIPPED: cannot build the veth pair here ({e})")
                return SKIP
            token = os.path.join(tmp, "token")
            with open(token, "w") as f:
                f.write("netns-test-token\n")
            wrong = os.path.join(tmp, "wrong")
            with open(wrong, "w") as f:
                f.write("not-the-token\n")
            with socket.socket() as s:  # a port number; the namespaces have their own
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            log = open(os.path.join(tmp, "server.log"), "w")
            server = subprocess.Popen(
                ["ip", "netns", "exec", ns_a, kv_server, f"--db={tmp}/db",
                 f"--listen=10.231.7.1:{port}", f"--auth_token_file={token}"],
                stdout=log, stderr=subprocess.STDOUT)
            check(wait_listening(ns_a, port, time.time() + 20), "kv_server never listened")
            peer = f"--peer=10.231.7.1:{port}"
            common = ["--benchmarks=peer_put,peer_get", "--num=64", "--value_size=65536",
                      "--batch_size=4", "--progress_interval=0", "--json", peer]
            p = sh("ip", "netns", "exec", ns_b, kv_bench, *common, f"--auth_token_file={token}",
                   check_rc=False)
            check(p.returncode == 0, f"kv_bench across the veth exited {p.returncode}: "
                                     f"{p.stderr[-1500:]}")
            get = [line for line in p.stdout.splitlines() if '"peer_get"' in line]
            check(len(get) == 1, f"no peer_get record: {p.stdout[-1500:]}")
            if get:
                import json
                r = json.loads(get[0])
                check(r["errors"] == 0, f"peer_get errors: {r.get('first_error')}")
                check(r["verified"] > 0 and r["verified"] == r["found"] == r["lookups"],
                      f"peer_get verified {r['verified']} found {r['found']} "
                      f"of {r['lookups']}")
            p = sh("ip", "netns", "exec", ns_b, kv_bench, *common, f"--auth_token_file={wrong}",
                   check_rc=False)
            check(p.returncode != 0 and "refused" in p.stderr,
                  f"a wrong token was not refused: exit {p.returncode}: {p.stderr[-500:]}")
            # The client's namespace is the only way in: from here (the test's own
            # namespace) there is no route to the server.
            with socket.socket() as s:
                s.settimeout(1)
                check(s.connect_ex(("10.231.7.1", port)) != 0,
                      "the server is reachable outside its namespace")
            server.send_signal(signal.SIGTERM)
            try:
                rc = server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
            check(rc == 0, f"kv_server exited {rc} after SIGTERM")
            server = None
            log.close()
        finally:
            if server is not None:
                server.kill()
                server.wait()
            for ns in (ns_a, ns_b):  # deleting a namespace deletes its end of the pair
                sh("ip", "netns", "del", ns, check_rc=False)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
