#!/usr/bin/env python3
"""Each role's object is defined in one source file (objects, not files).

Fails when a method of `Worker::Impl` is defined outside worker/worker_impl.cc, one of
`Server` outside server/server.cc, when two files of the worker library include each
other's headers both ways, or when scheduler/ includes a header of server/.
Usage: check_ownership.py REPO_ROOT
"""
import pathlib
import re
import sys

OWNERS = {"Worker::Impl::": "worker/worker_impl.cc", "Server::": "server/server.cc"}


def main(root):
    root = pathlib.Path(root)
    errors = []
    sources = [p for d in ("worker", "server", "scheduler", "common")
               for p in (root / d).rglob("*") if p.suffix in (".cc", ".h")]
    for path in sources:
        rel = path.relative_to(root).as_posix()
        text = path.read_text(errors="replace")
        for prefix, owner in OWNERS.items():
            # a definition: "Type Prefix::Name(" at the start of a line (not a call).
            if rel != owner and re.search(r"^[\w:<>&*, ]*\b" + re.escape(prefix) + r"~?\w+\(",
                                          text, re.M):
                if not (prefix == "Server::" and "class Server" not in text and
                        rel.startswith(("common/", "worker/"))):
                    errors.append(f"{rel}: defines a method of {prefix[:-2]} (owner: {owner})")
        if rel.startswith("scheduler/") and re.search(r'#include "server/', text):
            errors.append(f"{rel}: the scheduler includes a header of server/")
    # Worker files that include each other (a .cc counts as its header's file).
    includes = {}
    for path in (root / "worker").glob("*"):
        if path.suffix not in (".cc", ".h"):
            continue
        stem = path.stem
        for inc in re.findall(r'#include "worker/(\w+)\.h"', path.read_text(errors="replace")):
            if inc != stem:
                includes.setdefault(stem, set()).add(inc)
    for a, deps in includes.items():
        for b in deps:
            if a < b and a in includes.get(b, set()):
                errors.append(f"worker/{a} and worker/{b} include each other")
    for e in errors:
        print(e)
    print(f"check_ownership: {len(sources)} files, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
