"""One LMCache process for test_lmcache_plugin.py's two-process test: it builds its L2
adapter from the --l2-adapter JSON (kvengine's plug-in on a shared path), then stores,
looks up and loads chunks on command over a multiprocessing pipe.  Spawned, so each is
a fresh interpreter opening (or attaching to) the store by itself."""
import traceback

import lmcache_driver as drv
import lmcache_fakes as lf


def main(conn, adapter_spec, size):
    try:
        adapter = lf.make_adapter_from_cli(adapter_spec)
        conn.send(("ready", adapter._client._shared.attached))
        while True:
            command, args = conn.recv()
            if command == "close":
                adapter.close()
                conn.send(("ok", None))
                return
            if command == "attached":
                conn.send(("ok", adapter._client._shared.attached))
            elif command == "store":  # chunk numbers -> store result
                objs = [drv.memory_obj(drv.chunk_bytes(i, size)) for i in args]
                result = drv.store(adapter, [drv.key(i) for i in args], objs)
                conn.send(("ok", bool(result.is_successful())))
            elif command == "lookup":
                conn.send(("ok", drv.lookup(adapter, [drv.key(i) for i in args])))
            elif command == "load":  # -> (bits, whether each loaded chunk is bit-exact)
                objs = [drv.memory_obj(size=size, fill=0xEE) for _ in args]
                bits = drv.load(adapter, [drv.key(i) for i in args], objs)
                exact = [bytes(o.byte_array) == drv.chunk_bytes(i, size)
                         for i, o in zip(args, objs)]
                conn.send(("ok", (bits, exact)))
            else:
                conn.send(("error", "unknown command %r" % command))
    except Exception:  # noqa: BLE001 -- reported to the test
        conn.send(("error", traceback.format_exc()))
