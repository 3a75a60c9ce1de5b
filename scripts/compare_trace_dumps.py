#!/usr/bin/env python3
"""Pairs the two replays of `kv_bench --compare_planner --trace_dump_requests=PREFIX`
request by request and says where planner-on's prefill saved differs from planner-off's.

Usage: compare_trace_dumps.py PREFIX   (reads PREFIX.on.tsv and PREFIX.off.tsv)

A request's saved figure is what the report counts: its compute less its load (the
re-check included with the planner) when the load beat the compute, else 0.  The
difference on - off is summed by category:
  cut_ssd_faster   the off-load read a key from SSD and beat recompute; the planner loaded
                   fewer blocks
  cut_ssd_slower   the off-load read a key from SSD and was slower; the planner loaded fewer
  memory_same      both loads read memory only, the same blocks: split into the re-check's
                   time and the rest (the loads' own time)
  other            the rest (the two caches held different blocks by then, ...)
"""
import csv
import sys


def read(path):
    with open(path) as f:
        return {int(r["request"]): r for r in csv.DictReader(f, delimiter="\t")}


def counted(r):
    return max(0.0, float(r["saved_us"])) if int(r["loaded_blocks"]) > 0 else 0.0


def main():
    prefix = sys.argv[1]
    on, off = read(prefix + ".on.tsv"), read(prefix + ".off.tsv")
    cats = {}

    def add(cat, diff, **extra):
        c = cats.setdefault(cat, {"requests": 0, "diff_us": 0.0, "gain_us": 0.0, "loss_us": 0.0})
        c["requests"] += 1
        c["diff_us"] += diff
        c["gain_us" if diff > 0 else "loss_us"] += diff
        for k, v in extra.items():
            c[k] = c.get(k, 0.0) + v

    total_on = total_off = 0.0
    for i in sorted(set(on) & set(off)):
        a, b = on[i], off[i]
        sa, sb = counted(a), counted(b)
        total_on += sa
        total_off += sb
        diff = sa - sb
        la, lb = int(a["loaded_blocks"]), int(b["loaded_blocks"])
        if int(b["ssd_keys"]) > 0 and la < lb:
            add("cut_ssd_faster" if float(b["saved_us"]) > 0 else "cut_ssd_slower", diff)
        elif (la == lb and la > 0 and int(a["ssd_keys"]) == 0 and int(b["ssd_keys"]) == 0):
            recheck = float(a["recheck_us"])
            load_diff = float(a["load_us"]) - float(b["load_us"])
            add("memory_same", diff, recheck_us=recheck, load_diff_us=load_diff,
                on_slower=1.0 if float(a["saved_us"]) <= 0 else 0.0,
                off_slower=1.0 if float(b["saved_us"]) <= 0 else 0.0)
        elif la == 0 and lb == 0:
            add("none_loaded", diff)
        else:
            sub = "other_ssd_in_off" if int(b["ssd_keys"]) > 0 else "other"
            add(sub, diff, found_diff=int(a["found_blocks"]) - int(b["found_blocks"]),
                loaded_diff=la - lb)
    print(f"saved: on {total_on / 1e6:.4f} s, off {total_off / 1e6:.4f} s, "
          f"on - off {(total_on - total_off) / 1e6:+.4f} s over {len(set(on) & set(off))} requests")
    for cat, c in sorted(cats.items()):
        extra = ", ".join(f"{k} {v / 1e6:+.4f} s" if k.endswith("_us") and k not in
                          ("diff_us", "gain_us", "loss_us") else f"{k} {v:g}"
                          for k, v in c.items() if k not in ("requests", "diff_us", "gain_us", "loss_us"))
        print(f"  {cat:16s} {c['requests']:6d} requests: on - off {c['diff_us'] / 1e6:+.4f} s "
              f"(gains {c['gain_us'] / 1e6:+.4f}, losses {c['loss_us'] / 1e6:+.4f})"
              + (f"; {extra}" if extra else ""))


if __name__ == "__main__":
    main()
