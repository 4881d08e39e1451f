#!/usr/bin/env python3
"""Every code name a doc cites in backticks exists in the tree.

Usage: check_doc_names.py ROOT DOC...   (DOC relative to ROOT; exit 1 naming what is missing)

Checked, per backticked token (a token "path: Name" is both):
  - file paths (with a '/' or a source extension): exist under ROOT, after expanding
    `dir/name.{h,cc}` and `name.*`;
  - `Foo::Bar` and `Foo.Bar` (Foo capitalised): `Foo::Bar` is written in a source file, or a
    file that declares class/struct/enum/table `Foo` names `Bar`;
  - a bare CamelCase or SCREAMING_CASE identifier: a word of some source file;
  - `adaps-...` executables: an add_executable of that name in a CMakeLists.txt.
Expressions (spaces, parentheses, quotes, '<', '=', flags) are prose, not names: skipped.
"""
import glob
import os
import re
import sys

SOURCE_DIRS = ("common", "scheduler", "server", "worker", "schemas", "bench", "deploy", "tests",
               "examples", "cmake")
SOURCE_EXT = (".h", ".cc", ".cu", ".fbs", ".py", ".sh", ".txt", ".cmake")
FILE_EXT = SOURCE_EXT + (".md", ".yml", ".yaml", ".json")


def load_sources(root):
    texts = {}
    for top in SOURCE_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [x for x in dirs if not x.startswith(("build", "."))]
            for f in files:
                if f.endswith(SOURCE_EXT):
                    p = os.path.join(d, f)
                    with open(p, encoding="utf-8", errors="replace") as fh:
                        texts[os.path.relpath(p, root)] = fh.read()
    return texts


def expand(path):
    m = re.match(r"^(.*)\{([^}]*)\}(.*)$", path)
    if m:
        return [m.group(1) + alt + m.group(3) for alt in m.group(2).split(",")]
    return [path]


def path_exists(root, path):
    for p in expand(path.rstrip("/")):
        full = os.path.join(root, p)
        if "*" in p:
            if not glob.glob(full):
                return False
        elif not os.path.exists(full) and not glob.glob(full + ".*"):  # a stem: `dir/name`
            return False
    return True


def qualified_exists(texts, name):
    parts = re.split(r"::|\.", name)
    if "::" in name and any(name in t for t in texts.values()):
        return True
    owner, member = parts[-2], parts[-1]
    decl = re.compile(r"\b(class|struct|enum class|enum|table|union)\s+(\w+::)*" +
                      re.escape(owner) + r"\b")
    word = re.compile(r"\b" + re.escape(member) + r"\b")
    return any(decl.search(t) and word.search(t) for t in texts.values())


def word_exists(texts, name):
    word = re.compile(r"\b" + re.escape(name) + r"\b")
    return any(word.search(t) for t in texts.values())


def executable_exists(texts, name):
    pat = re.compile(r"add_executable\(\s*" + re.escape(name) + r"\b")
    return any(pat.search(t) for p, t in texts.items() if p.endswith("CMakeLists.txt"))


def check_token(root, texts, token):
    """The names in `token` that are not found (empty: all found or nothing to check)."""
    if ": " in token:
        return [m for part in token.split(": ") for m in check_token(root, texts, part)]
    if re.fullmatch(r"[\w./*-]+(\{[\w,]+\})?[\w./*-]*", token) and (
            token.endswith(FILE_EXT) or token.endswith(".*") or "/" in token or "{" in token):
        return [] if path_exists(root, token) else [token]
    if re.search(r"[\s()\"'<>=,;]", token) or token.startswith("-"):
        return []
    if re.fullmatch(r"[A-Z]\w*((::|\.)\w+)+", token):
        return [] if qualified_exists(texts, token) else [token]
    if re.fullmatch(r"adaps-[\w-]+", token):
        return [] if executable_exists(texts, token) else [token]
    if re.fullmatch(r"[A-Z][a-z0-9]+[A-Z]\w*|[A-Z][A-Z0-9_]{3,}", token):
        return [] if word_exists(texts, token) else [token]
    return []


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1]
    texts = load_sources(root)
    missing, checked = [], 0
    for doc in argv[2:]:
        with open(os.path.join(root, doc), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        in_fence = False
        for n, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            for token in re.findall(r"`([^`]+)`", line):
                checked += 1
                missing += [f"{doc}:{n}: `{m}` not found in the tree"
                            for m in check_token(root, texts, token)]
    for m in missing:
        print(m)
    print(f"check_doc_names: {checked} backticked tokens, {len(missing)} names missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
