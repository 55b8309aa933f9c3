#!/usr/bin/env python3
"""Lists non-test Rust functions longer than a limit (default 120 lines).

Walks the workspace's crates (not `target/`, not test files or `#[cfg(test)]`
modules, not `#[test]` functions) and counts each function from its `fn`
line to its closing brace. Exits 1 if one is over the limit and not in the
allow file (`path::name` per line, with `#` comments): functions known to
be too long, to be split; the file only ever shrinks. With `--tests`, the
test functions (`#[test]`, `#[tokio::test]`) everywhere instead.

    scripts/long-functions.py [--limit 120] [--allow scripts/long-functions.allow]
    scripts/long-functions.py --tests --limit 110 --allow scripts/long-tests.allow
"""
import argparse
import os
import re
import sys

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")
TEST_FN = re.compile(r"^\s*#\[(?:[a-z_]+::)?test\b")
TEST_ATTR = re.compile(r"^\s*#\[(?:[a-z_]+::)?test\b|^\s*#\[cfg\(test\)\]")


def strip(source):
    """The source with comments, strings and chars blanked (lines kept)."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif source.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if source.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif source.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * source.count("\n", i, j))
            i = j
        elif re.match(r'b?r#*"', source[i:i + 12]) and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', source[i:])
            end = '"' + m.group(1)
            j = source.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append("\n" * source.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            out.append("\n" * source.count("\n", i, j + 1))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}'), not a lifetime.
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|.)|[^\\'])'", source[i:])
            if m:
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path, tests=False):
    """(name, first line, length) of each function in `path`: with `tests`
    the test functions (`#[test]`, `#[tokio::test]`), else every function
    outside them and outside `#[cfg(test)]` modules."""
    with open(path, encoding="utf-8") as f:
        lines = strip(f.read()).split("\n")
    marker = TEST_FN if tests else TEST_ATTR
    found, skip_depth, depth, pending = [], None, 0, False
    open_fns = []  # (name, line, depth at which its body opened)
    for number, line in enumerate(lines, 1):
        if marker.match(line):
            pending = True
        m = FN.match(line)
        if m and skip_depth is None:
            if pending == tests:
                open_fns.append((m.group(1), number, depth))
            elif not tests:
                skip_depth = depth  # a test function: not counted
            pending = False
        elif not tests and pending and re.match(r"^\s*(pub\s+)?mod\s", line) and skip_depth is None:
            skip_depth = depth  # a #[cfg(test)] module
            pending = False
        for c in line:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if skip_depth is not None and depth == skip_depth:
                    skip_depth = None
                while open_fns and depth == open_fns[-1][2]:
                    name, start, _ = open_fns.pop()
                    found.append((name, start, number - start + 1))
            elif c == ";" and open_fns and depth == open_fns[-1][2]:
                open_fns.pop()  # a declaration without a body
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=120)
    parser.add_argument("--tests", action="store_true")
    parser.add_argument("--allow", default=os.path.join(os.path.dirname(__file__), "long-functions.allow"))
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    allowed = set()
    if os.path.exists(args.allow):
        with open(args.allow) as f:
            allowed = {l.split("#")[0].strip() for l in f} - {""}
    over, listed = [], set()
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        dirs[:] = [d for d in dirs if d not in ("target", "node_modules") and not d.startswith(".")
                   and (args.tests or not (d == "tests" and rel != "."))]
        for name in sorted(files):
            if not name.endswith(".rs") or (name == "tests.rs" and not args.tests):
                continue
            path = os.path.join(top, name)
            for fn, line, length in functions(path, args.tests):
                if length > args.limit:
                    key = f"{os.path.relpath(path, root)}::{fn}"
                    if key in allowed:
                        listed.add(key)
                    else:
                        over.append((length, key, line))
    for key in sorted(listed):
        print(f"allowed for now: {key}")
    for length, key, line in sorted(over, reverse=True):
        print(f"{key} (line {line}) is {length} lines, over {args.limit}")
    stale = allowed - listed
    for key in sorted(stale):
        print(f"no longer too long, drop it from the allow file: {key}")
    if over or stale:
        sys.exit(1)
    kind = "test function" if args.tests else "function"
    print(f"no new {kind} over {args.limit} lines ({len(listed)} allowed for now)")


if __name__ == "__main__":
    main()
