"""A spawned test process that answers commands over a pipe (test_vllm_processes.py,
test_sglang_processes.py): each is a fresh interpreter, started with the 'spawn' method
as vLLM's and SGLang's processes are, that opens or attaches to the store by itself.

The target is called as target(conn, *args); it sends ("ready", value) once set up, then
answers each (command, args) it receives with (command or "ok", value), or ("error",
traceback)."""
import time

TIMEOUT_S = 120  # a bound on hangs, not a timing check: spawning imports torch


class Spawned:
    def __init__(self, ctx, target, *args, wait=True):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child,) + args, daemon=True)
        self.process.start()
        self.ready = self._expect("ready") if wait else None

    @classmethod
    def all(cls, ctx, *calls):
        """Starts one process per (target, *args) at once, then waits until each is
        ready: their start-ups (each imports torch) overlap."""
        procs = []
        try:
            for target, *args in calls:
                procs.append(cls(ctx, target, *args, wait=False))
            for p in procs:
                p.ready = p._expect("ready")
        except BaseException:
            for p in procs:
                p.kill()
            raise
        return procs

    def _expect(self, what):
        deadline = time.monotonic() + TIMEOUT_S
        while not self.conn.poll(0.1):
            assert self.process.is_alive(), "the process died before answering %s" % what
            assert time.monotonic() < deadline, "no answer to %s" % what
        status, value = self.conn.recv()
        assert status in (what, "ok"), value
        return value

    def __call__(self, command, *args):
        self.conn.send((command, args))
        return self._expect(command)

    def close(self):
        if self.process.is_alive():
            try:
                self("close")
            finally:
                self.process.join(TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()

    def kill(self):
        """SIGKILL, as an out-of-memory kill or a crash ends a process: nothing closes."""
        self.process.kill()
        self.process.join(TIMEOUT_S)
