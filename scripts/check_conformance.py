#!/usr/bin/env python3
"""kvengine's stand-ins of vLLM, SGLang or LMCache checked member for member against that
project's source tree, given by path: runs test/python/<project>_conformance.py (its
docstring says what is checked; docs/<project>.md, "Conformance with ... main", the
commit last checked).

    scripts/check_vllm_conformance.py /path/to/vllm [--only PARTS]
    scripts/check_sglang_conformance.py /path/to/sglang
    scripts/check_lmcache_conformance.py /path/to/lmcache
    scripts/check_conformance.py vllm /path/to/vllm      # the same, by argument

(check_<project>_conformance.py are links to this file.)  Exit 0: conforming; 1: one
line per problem, naming the member; 77: no tree (skipped).  CI has none of the three
projects' sources: pytest runs the checks only with VLLM_SOURCE_DIR, SGLANG_SOURCE_DIR
or LMCACHE_SOURCE_DIR set."""
import importlib
import os
import re
import sys

PROJECTS = ("vllm", "sglang", "lmcache")


def main(argv):
    named = re.fullmatch(r"check_(\w+)_conformance\.py", os.path.basename(argv[0]))
    if named and named.group(1) in PROJECTS:
        project, args = named.group(1), argv[1:]
    elif len(argv) > 1 and argv[1] in PROJECTS:
        project, args = argv[1], argv[2:]
    else:
        print("usage: %s {%s} SOURCE_TREE [--only PARTS]" % (argv[0], ",".join(PROJECTS)),
              file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "test", "python"))
    return importlib.import_module(project + "_conformance").main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
