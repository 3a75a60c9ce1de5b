#!/usr/bin/env python3
"""Clang's thread-safety analysis over every library and tool source.

  scripts/check_thread_safety.py BUILD_DIR [JOBS [SOURCE...]]

Reads BUILD_DIR/compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS, which
scripts/run_tests.sh turns on) and runs `clang++ -fsyntax-only -Wthread-safety -Werror`
over each source outside test/ and python/, with the real build's include paths and
defines.  Syntax only: no code is generated, so it costs a fraction of a build.  Exits
non-zero, printing clang's diagnostics, on any warning.  The annotations are in
util/thread_annotations.h, the annotated locks in util/mutex.h.
"""
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

CLANG_FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror",
               "-Wno-unknown-warning-option"]
SKIP_DIRS = ("test", "python")


def clang_command(entry, clang):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = [clang]
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-o", "-MF", "-MT", "-MQ"):
            i += 2
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-O") or a == entry["file"]:
            i += 1
            continue
        # gcc-only warning switches and options clang does not know
        # the build's own warning switches (gcc's, and -Werror for all of them): only the
        # analysis' warnings fail this check
        if a.startswith("-W") or a.startswith("-fsanitize") or a == "-fno-omit-frame-pointer":
            i += 1
            continue
        out.append(a)
        i += 1
    return out + CLANG_FLAGS + [entry["file"]]


def main():
    build_dir = sys.argv[1] if len(sys.argv) > 1 else "build"
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    only = sys.argv[3:]  # sources (or directories) to check, default all
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    clang = shutil.which("clang++") or sys.exit("check_thread_safety: clang++ not found")
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    chosen = []
    for e in entries:
        rel = os.path.relpath(e["file"], root)
        if rel.startswith("..") or rel.split(os.sep)[0] in SKIP_DIRS:
            continue
        if not rel.endswith((".cc", ".cpp")):
            continue
        if only and not any(rel.startswith(o) for o in only):
            continue
        chosen.append((rel, e))
    start = time.time()

    def run(item):
        rel, e = item
        p = subprocess.run(clang_command(e, clang), cwd=e["directory"], capture_output=True,
                           text=True)
        return rel, p.returncode, p.stdout + p.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for rel, rc, text in pool.map(run, chosen):
            if rc != 0 or text.strip():
                failed.append(rel)
                sys.stdout.write(text)
    took = time.time() - start
    if failed:
        print(f"check_thread_safety: {len(failed)} of {len(chosen)} sources fail: "
              + " ".join(failed))
        return 1
    print(f"check_thread_safety: {len(chosen)} sources clean ({took:.1f} s, {jobs} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
