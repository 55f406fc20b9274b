#!/usr/bin/python3
"""The project speaks of itself alone: no tracked file names a work session
or an issue by its number, and none cites a path outside the repository (the
shared folder beside a checkout, a machine's own tree). Say the rule itself,
or link the doc section that states it. This file is read like any other.

Usage: check_only_project.py SOURCE_DIR
"""
import pathlib
import re
import subprocess
import sys

PATTERNS = [
    (re.compile(r"session ?[0-9]|issue ?[0-9]", re.I), "names a session or an issue"),
    (re.compile(r"\.\./shared/|/work/(main|shared|base)\b"), "cites a path outside the repository"),
]


def main():
    src = pathlib.Path(sys.argv[1])
    files = subprocess.run(["git", "-C", str(src), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    found = 0
    for rel in files:
        if not rel:
            continue
        path = src / rel
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for pattern, why in PATTERNS:
                if pattern.search(line):
                    found += 1
                    if found <= 50:
                        print(f"{rel}:{number}: {why}: {line.strip()[:120]}", file=sys.stderr)
    print(f"{len(files)} tracked files read, {found} lines that speak of things outside the "
          "project")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
