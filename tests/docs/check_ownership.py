#!/usr/bin/env python3
"""Each class is defined in one source file (objects, not files).

For every class or struct declared in a header under common/, server/, scheduler/ and
worker/ (nested ones such as `Worker::Impl` included), finds the .cc/.cu files that define
its out-of-line methods (`Type Class::Method(`, `Class::Class(`, `Class::~Class(` at the
start of a line) and fails when they are more than one, unless the class is listed in
tests/docs/ownership_allow.txt (`ClassName  reason`; the reason is required and printed).
An entry whose class is no longer split fails too, so the list stays true.
Also fails when a method of `Worker::Impl` is defined outside worker/worker_impl.cc, one of
`Server` outside server/server.cc, when two files of the worker library include each
other's headers both ways, or when scheduler/ includes a header of server/.
Usage: check_ownership.py REPO_ROOT [ALLOW_FILE]
"""
import pathlib
import re
import sys

FOLDERS = ("common", "server", "scheduler", "worker")
OWNERS = {"Worker::Impl::": "worker/worker_impl.cc", "Server::": "server/server.cc"}
ALLOW_FILE = pathlib.Path(__file__).with_name("ownership_allow.txt")

# A class head in a header: "class Name {", "struct A::B final : Base<T> {" ("enum class"
# is matched too, then skipped); and the braces, to know which class encloses which.
HEAD = re.compile(r"\b(enum\s+)?(?:class|struct)\s+(?:alignas\([^)]*\)\s+)?(\w+(?:::\w+)*)"
                  r"\s*(?:final\s*)?(?::[^;{}()]*)?\{|[{}]")
# An out-of-line definition: at the start of a line, an optional return type without
# "=", ";", "(" or braces (so no call or initialiser), then "A::B::Name(".
DEFINITION = re.compile(r"^(?![\s#])(?:[^=;(){}\"\n]*?[\s*&])?((?:\w+(?:<[^<>\n]*>)?::)+)"
                        r"(?:~?\w+|operator\b[^(\n]*)\s*\(", re.M)


def strip_comments(text):
    """Text without comments and string literals, lines kept where they were."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|(?<!\w)\'(?:\\.|[^\'\\\n])*\'',
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def declared_classes(text):
    """Qualified names of the classes and structs a header defines (with a body)."""
    stack, found = [], []
    for m in HEAD.finditer(strip_comments(text)):
        if m.group(0) == "}":
            if stack:
                stack.pop()
        elif m.group(0) == "{" or m.group(1):
            stack.append(None)  # namespace, function, enum, initialiser
        else:
            outer = [c for c in stack if c]
            name = "::".join(outer[-1:] + [m.group(2)])
            stack.append(name)
            found.append(name)
    return found


def defined_in(text, classes):
    """The known classes whose methods this source file defines out of line."""
    owners = set()
    for m in DEFINITION.finditer(strip_comments(text)):
        parts = [re.sub(r"<.*", "", p) for p in m.group(1).split("::")[:-1]]
        while parts and parts[0][:1].islower():  # namespaces: adaps::, cuda::
            parts.pop(0)
        # A class nested in a .cc belongs to the longest known class it is in.
        for n in range(len(parts), 0, -1):
            if "::".join(parts[:n]) in classes:
                owners.add("::".join(parts[:n]))
                break
    return owners


def read_allow(path):
    allow, errors = {}, []
    if not path.exists():
        return allow, errors
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, reason = line.strip().partition(" ")
        if not reason.strip():
            errors.append(f"{path.name}:{i}: {name} has no reason")
        allow[name] = reason.strip()
    return allow, errors


def check_split(root, allow_path):
    """Classes whose methods are defined in more than one source file."""
    errors = []
    headers = [p for d in FOLDERS for p in (root / d).rglob("*.h")]
    classes = {}
    for h in headers:
        for name in declared_classes(h.read_text(errors="replace")):
            classes.setdefault(name, []).append(h.relative_to(root).as_posix())
    files = {}
    for d in FOLDERS:
        for src in sorted((root / d).rglob("*")):
            if src.suffix in (".cc", ".cu"):
                for name in defined_in(src.read_text(errors="replace"), classes):
                    files.setdefault(name, []).append(src.relative_to(root).as_posix())
    allow, errors = read_allow(allow_path)
    split = {name: f for name, f in files.items() if len(f) > 1}
    for name, f in sorted(split.items()):
        if name in allow:
            print(f"allowed split: {name} ({', '.join(f)}): {allow[name]}")
        else:
            errors.append(f"{name} is defined across {len(f)} files: {', '.join(f)} "
                          f"(one class, one source file; or add it to {allow_path.name} "
                          "with the reason)")
    for name in sorted(set(allow) - set(split)):
        where = ", ".join(files.get(name, [])) or "no source file"
        errors.append(f"{allow_path.name}: {name} is no longer split ({where}): "
                      "remove its entry")
    print(f"check_ownership: {len(classes)} classes in {len(headers)} headers, "
          f"{len(files)} with out-of-line methods, {len(split)} split "
          f"({len(set(split) & set(allow))} allowed)")
    return errors


def check_rules(root):
    """The role rules: two owners, no include cycle in worker/, scheduler without server/."""
    errors = []
    sources = [p for d in FOLDERS for p in (root / d).rglob("*") if p.suffix in (".cc", ".h")]
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
    return errors


def main(root, allow_path=ALLOW_FILE):
    root = pathlib.Path(root)
    errors = check_rules(root) + check_split(root, pathlib.Path(allow_path))
    for e in errors:
        print(e)
    print(f"check_ownership: {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]) if len(sys.argv) > 1 else main("."))
