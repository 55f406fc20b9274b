#!/usr/bin/env python3
"""Fails when a *_test.cc under tests/ is in no build: every test source must
be named (by its file name or, in a foreach list, by its stem) in the
CMakeLists.txt of its own folder, outside comments. A test file that no
CMakeLists.txt names is never compiled and proves nothing, while docs may
still cite it (issue: limits_test.cc was cited and never built)."""
import pathlib
import re
import sys

TESTS = pathlib.Path(__file__).resolve().parent


def cmake_words(cmakelists):
    text = "\n".join(line.split("#", 1)[0] for line in cmakelists.read_text().splitlines())
    return set(re.findall(r"[A-Za-z0-9_.]+", text))


def main():
    missing = []
    sources = sorted(TESTS.rglob("*_test.cc"))
    for src in sources:
        cmakelists = src.parent / "CMakeLists.txt"
        words = cmake_words(cmakelists) if cmakelists.exists() else set()
        if src.name not in words and src.stem not in words:
            missing.append(str(src.relative_to(TESTS.parent)))
    if missing:
        print("test sources that no CMakeLists.txt builds:")
        for m in missing:
            print("  " + m)
        return 1
    print(f"all {len(sources)} *_test.cc files under tests/ are named in their CMakeLists.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
