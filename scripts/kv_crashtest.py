#!/usr/bin/env python3
"""kv_crashtest: kills kv_stress with SIGKILL at random times, restarts it, and lets it
verify the DB against its expected state (docs/kv_stress.md), in the manner of RocksDB's
db_crashtest.py.

  kv_crashtest.py --kv_stress=build/kv_stress [--mode=solo|attach|peer]
                  [--policy=write_back|write_through|both] [--rounds=N] [--ssd_pressure]
                  [--dir=DIR] [-- more kv_stress flags]

Each round starts the processes (solo: one kv_stress; attach: a kv_stress owner serving a
socket and --clients attached kv_stress clients, each writing its own workers' keys;
peer: one kv_stress in sharded mode beside a kv_server holding half the keys), waits
until they run, sleeps a random time and kills with SIGKILL: in attach mode either the
owner (with every client) or one client, chosen at random.  A restarted owner or solo
process first reads every key back and judges it against the expected state; a
restarted client judges its own keys.  After the last round a clean kv_stress
--verify_only checks the DB once more and closes it.  Per policy it prints

  kv_crashtest write_back solo: R rounds, O ops, V verified reads, L lost, W wrong, X resurrected (...)

and exits 1 when any of lost, wrong, resurrected or errors is not 0, or a process died
on its own (its stderr is printed), 2 on a usage error.

The default is the short mode CTest runs (a few rounds).  KV_STRESS_LONG=1 (or --long)
selects the long mode: 200 rounds per policy, longer runs between kills, more keys.
"""

import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

READY = "kv_stress: ready"
# After killing a process whose DB lives on elsewhere (an attach client, kv_stress beside
# its peer), how long to let the requests it had sent land before it restarts and reads
# its keys back (docs/kv_stress.md, "Roles and modes").
LATE_REQUESTS_S = 0.3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """One kv_stress (or kv_server) process, its output collected by a thread."""

    def __init__(self, name, argv, ready_text):
        self.name = name
        self.argv = argv
        self.lines = []
        self.ready = threading.Event()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, errors="replace")
        self.reader = threading.Thread(target=self._read, args=(ready_text,), daemon=True)
        self.reader.start()

    def _read(self, ready_text):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))
            if ready_text in line:
                self.ready.set()
        self.ready.set()  # exited: nobody waits forever

    def wait_ready(self, timeout):
        if not self.ready.wait(timeout) or self.p.poll() is not None:
            raise RuntimeError("%s did not become ready (exit %s):\n%s" %
                               (self.name, self.p.poll(), self.output()))

    def alive(self):
        return self.p.poll() is None

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self.reader.join(5)

    def output(self):
        return "\n".join("    " + l for l in self.lines[-60:])

    def failures(self):
        return [l for l in self.lines if "kv_stress: FAIL" in l or "kv_stress: ERROR" in l]


def parse_report(text):
    counts = {}
    for n, name in re.findall(r"(\d+) ([a-z_]+)", text):
        counts[name] = int(n)
    return counts


class Run:
    """The rounds of one policy in one mode."""

    def __init__(self, args, policy, extra):
        self.args = args
        self.policy = policy
        self.dir = os.path.join(args.dir, "%s-%s" % (args.mode, policy))
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.db = os.path.join(self.dir, "db")
        self.state = os.path.join(self.dir, "db.state")
        self.socket = os.path.join(self.dir, "s.sock")
        self.rng = random.Random(args.seed)
        self.problems = []
        self.common = [
            "--state=" + self.state, "--policy=" + policy, "--keys=%d" % args.keys,
            "--threads=%d" % args.threads, "--value_max=%d" % args.value_max,
            "--memory_bytes=%d" % args.memory_bytes,
        ]
        if args.ssd_pressure:
            self.common.append("--ssd_bytes=%d" % args.ssd_pressure_bytes)
        if args.zipf:
            self.common.append("--zipf")
        if args.namespaces:
            self.common.append("--namespaces=%d" % args.namespaces)
        self.common += extra
        self.server = None
        self.procs = []  # every process started, killed whatever happens
        self.rounds_done = 0
        self.server_port = None
        self.listen_port = None

    def stress(self, name, role_args):
        argv = [self.args.kv_stress] + self.common + role_args
        p = Proc(name, argv, READY)
        self.procs.append(p)
        return p

    def start_owner(self):
        workers = self.args.threads * (1 + self.args.clients)
        p = self.stress("owner", ["--db=" + self.db, "--role=owner", "--socket=" + self.socket,
                                  "--workers=%d" % workers, "--worker_base=0"])
        p.wait_ready(self.args.ready_timeout)
        return p

    def start_client(self, i):
        p = self.stress("client %d" % i,
                        ["--role=client", "--socket=" + self.socket,
                         "--worker_base=%d" % (self.args.threads * (i + 1))])
        p.wait_ready(self.args.ready_timeout)
        return p

    def start_solo(self):
        extra = []
        if self.args.mode == "peer":
            extra = ["--peer=127.0.0.1:%d" % self.server_port,
                     "--listen=127.0.0.1:%d" % self.listen_port]
        p = self.stress("kv_stress", ["--db=" + self.db] + extra)
        p.wait_ready(self.args.ready_timeout)
        return p

    def start_server(self):
        self.server_port = free_port()
        self.listen_port = free_port()
        argv = [self.args.kv_server, "--db=" + os.path.join(self.dir, "peer"),
                "--listen=127.0.0.1:%d" % self.server_port, "--transport=tcp",
                "--options=memory_capacity_bytes=%d,use_huge_pages=false,prefault_memory=false,"
                "max_value_size=%d,log_level=error" % (self.args.memory_bytes * 2,
                                                       self.args.value_max)]
        self.server = Proc("kv_server", argv, "kv_server: serving")
        self.server.wait_ready(self.args.ready_timeout)

    def check_alive(self, procs):
        for p in procs:
            if not p.alive():
                self.problems.append("%s exited on its own (status %s):\n%s" %
                                     (p.name, p.p.returncode, p.output()))

    def note_failures(self, procs):
        for p in procs:
            for line in p.failures():
                self.problems.append("%s: %s" % (p.name, line))

    def sleep_random(self):
        time.sleep(self.rng.uniform(self.args.kill_min_s, self.args.kill_max_s))

    def out_of_time(self):
        d = self.args.deadline_s
        return d > 0 and time.time() - self.args.started > d

    def progress(self, done):
        if done % 25 == 0 and done < self.args.rounds:
            print("kv_crashtest %s %s: %d of %d rounds" % (self.policy, self.args.mode, done,
                                                          self.args.rounds), flush=True)

    def run(self):
        if self.args.mode == "peer":
            self.start_server()
        try:
            if self.args.mode == "attach":
                self.run_attach()
            else:
                self.run_solo()
            self.final_verify()
        except RuntimeError as e:
            self.problems.append(str(e))
            path = self.dump_stacks()
            if path is not None:
                self.problems.append("the stacks of every live process: " + path)
        finally:
            for p in self.procs:
                p.kill()
            if self.server is not None:
                self.check_alive([self.server])
                self.server.p.send_signal(signal.SIGTERM)
                try:
                    self.server.p.wait(30)
                except subprocess.TimeoutExpired:
                    self.server.kill()
        return self.report()

    def dump_stacks_on_timeout(self, clients):
        """A client whose request timed out: the owner was stuck for 10 s or more, and may
        still be; its threads' stacks are dumped once per run, while they may show why."""
        if getattr(self, "stacks_dumped", False):
            return
        if any("timed out" in l for p in clients for l in p.failures()):
            self.stacks_dumped = True
            path = self.dump_stacks()
            if path is not None:
                print("  a request timed out: stacks in %s" % path, flush=True)

    def dump_stacks(self):
        """A process that stopped answering: every live process's threads, for whoever
        looks into it (gdb where it is installed), in the run's directory, kept.  Returns
        the file's path (None without gdb)."""
        if shutil.which("gdb") is None:
            return None
        path = os.path.join(self.dir, "stacks-%d.txt" % int(time.time()))
        with open(path, "w") as out:
            for p in self.procs + ([self.server] if self.server is not None else []):
                if not p.alive():
                    continue
                out.write("==== %s (pid %d)\n" % (p.name, p.p.pid))
                out.flush()
                subprocess.run(["gdb", "-p", str(p.p.pid), "-batch", "-ex",
                                "thread apply all bt"], stdout=out, stderr=subprocess.STDOUT,
                               timeout=120)
        self.args.keep = True
        return path

    def run_solo(self):
        for done in range(self.args.rounds):
            if self.out_of_time():
                break
            self.progress(done)
            p = self.start_solo()
            self.sleep_random()
            self.check_alive([p])
            p.kill()
            self.note_failures([p])
            self.rounds_done += 1
            if self.args.mode == "peer":
                time.sleep(LATE_REQUESTS_S)

    def run_attach(self):
        owner = self.start_owner()
        clients = [self.start_client(i) for i in range(self.args.clients)]
        for done in range(self.args.rounds):
            if self.out_of_time():
                break
            self.progress(done)
            self.sleep_random()
            self.check_alive([owner] + clients)
            self.dump_stacks_on_timeout(clients)
            self.rounds_done += 1
            if self.args.clients == 0 or self.rng.random() < 0.5:
                for p in clients + [owner]:  # clients first: they would see the owner die
                    p.kill()
                self.note_failures(clients + [owner])
                owner = self.start_owner()
                clients = [self.start_client(i) for i in range(self.args.clients)]
            else:
                i = self.rng.randrange(self.args.clients)
                clients[i].kill()
                self.note_failures([clients[i]])
                time.sleep(LATE_REQUESTS_S)
                clients[i] = self.start_client(i)
        for p in clients + [owner]:
            p.kill()
        self.note_failures(clients + [owner])

    def final_verify(self):
        extra = []
        if self.args.mode == "peer":
            extra = ["--peer=127.0.0.1:%d" % self.server_port,
                     "--listen=127.0.0.1:%d" % self.listen_port]
        r = subprocess.run([self.args.kv_stress] + self.common +
                           ["--db=" + self.db, "--verify_only"] + extra,
                           capture_output=True, text=True, timeout=600)
        for line in (r.stdout + r.stderr).splitlines():
            if "kv_stress: FAIL" in line or "kv_stress: ERROR" in line:
                self.problems.append("final verify: " + line)
        if r.returncode not in (0, 1):
            self.problems.append("final verify exited %d:\n%s%s" % (r.returncode, r.stdout,
                                                                     r.stderr))

    def report(self):
        r = subprocess.run([self.args.kv_stress, "--state=" + self.state, "--report"],
                           capture_output=True, text=True)
        c = parse_report(r.stdout)
        get = lambda k: c.get(k, 0)
        line = ("kv_crashtest %s %s%s: %d rounds, %d ops, %d verified reads, %d lost, %d wrong, "
                "%d resurrected (%d errors, %d refused, %d read_refused, %d dropped, "
                "%d flushes)" %
                (self.policy, self.args.mode, " ssd_pressure" if self.args.ssd_pressure else "",
                 self.rounds_done, get("ops"), get("verified_reads"), get("lost"), get("wrong"),
                 get("resurrected"), get("errors"), get("refused"), get("read_refused"),
                 get("dropped"), get("flushes")))
        print(line, flush=True)
        # Writes may be refused for room; reads never (an attached client's read of a
        # value not in memory is staged in rounds, docs/attach.md).
        bad = (get("lost") + get("wrong") + get("resurrected") + get("errors") +
               get("read_refused"))
        if self.rounds_done < self.args.rounds:
            print("  stopped at the deadline after %d of %d rounds" % (self.rounds_done,
                                                                      self.args.rounds), flush=True)
        if bad or self.problems or "ops" not in c or self.rounds_done == 0:
            for p in self.problems[:40]:
                print("  " + p, flush=True)
            if "ops" not in c:
                print("  no report: " + r.stdout + r.stderr, flush=True)
            return False
        if get("verified_reads") == 0 or get("flushes") == 0:
            print("  no reads or no flushes were verified: the run did nothing", flush=True)
            return False
        if not self.args.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        return True


def main():
    long_mode = os.environ.get("KV_STRESS_LONG", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv_stress", required=True)
    ap.add_argument("--kv_server", default="")
    ap.add_argument("--mode", choices=["solo", "attach", "peer"], default="solo")
    ap.add_argument("--policy", choices=["write_back", "write_through", "both"], default="both")
    ap.add_argument("--long", action="store_true", default=long_mode,
                    help="long mode (also KV_STRESS_LONG=1)")
    ap.add_argument("--rounds", type=int, default=0, help="default: 6, long 200")
    ap.add_argument("--clients", type=int, default=2, help="attach mode: client processes")
    ap.add_argument("--threads", type=int, default=0, help="per process; default 2, long 4")
    ap.add_argument("--keys", type=int, default=0, help="default 600, long 4000")
    ap.add_argument("--value_max", type=int, default=0, help="default 1 MiB, long 4 MiB")
    ap.add_argument("--memory_bytes", type=int, default=16 << 20)
    ap.add_argument("--ssd_pressure", action="store_true",
                    help="a small SSD tier (--ssd_pressure_bytes): GC above its high "
                         "watermark, offloads and flushes refused with NoSpace")
    ap.add_argument("--ssd_pressure_bytes", type=int, default=0,
                    help="default 64 MiB, long 512 MiB")
    ap.add_argument("--zipf", action="store_true")
    ap.add_argument("--namespaces", type=int, default=0,
                    help="kv_stress --namespaces: the keys spread over the default namespace "
                         "and this many more")
    ap.add_argument("--kill_min_s", type=float, default=-1)
    ap.add_argument("--kill_max_s", type=float, default=-1)
    ap.add_argument("--ready_timeout", type=float, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline_s", type=float, default=0,
                    help="start no round after this many seconds from the start (the "
                         "summary then says how many ran); 0: none")
    ap.add_argument("--dir", default="")
    ap.add_argument("--keep", action="store_true", help="keep the directories")
    args, extra = ap.parse_known_args()
    extra = [e for e in extra if e != "--"]
    L = args.long
    args.rounds = args.rounds or (200 if L else 6)
    args.threads = args.threads or (4 if L else 2)
    args.keys = args.keys or (4000 if L else 600)
    args.value_max = args.value_max or ((4 << 20) if L else (1 << 20))
    args.ssd_pressure_bytes = args.ssd_pressure_bytes or ((512 << 20) if L else (64 << 20))
    if args.kill_min_s < 0:
        args.kill_min_s = 0.5 if L else 0.2
    if args.kill_max_s < 0:
        args.kill_max_s = 5.0 if L else 1.5
    args.seed = args.seed or int(time.time())
    args.started = time.time()
    if args.mode == "peer" and not args.kv_server:
        ap.error("--mode=peer needs --kv_server")
    made_dir = not args.dir
    if made_dir:
        args.dir = tempfile.mkdtemp(prefix="kv_crashtest.")
    print("kv_crashtest: seed %d, %s mode, dir %s" % (args.seed, "long" if L else "short",
                                                    args.dir), flush=True)
    policies = ["write_back", "write_through"] if args.policy == "both" else [args.policy]
    ok = True
    for policy in policies:
        ok = Run(args, policy, extra).run() and ok
    if made_dir and ok and not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
