#!/usr/bin/python3
"""Every repository path a document names (in backquotes: `service/job/`,
`proto/wire.{h,cc}`, `bench/results/x/`) exists in the tree.

A path is a backquoted word that starts with one of the repository's top
folders (found from the root, or from the document's own folder); `{a,b}` expands to each choice; a trailing `:LINE` or `#anchor` is
dropped. Globs (`*`) and placeholders (`<...>`) are skipped.

Usage: check_doc_paths.py SOURCE_DIR DOC...
"""
import itertools
import pathlib
import re
import sys

TOPS = ("service/", "client/", "tests/", "bench/", "docs/", "proto/", "util/", "docker/",
        "scripts/", ".ci/")


def expand(path):
    parts = re.split(r"\{([^{}]*)\}", path)
    fixed, choices = parts[0::2], [p.split(",") for p in parts[1::2]]
    for combo in itertools.product(*choices):
        out = fixed[0]
        for c, f in zip(combo, fixed[1:]):
            out += c + f
        yield out


def main():
    src = pathlib.Path(sys.argv[1])
    missing = []
    named = 0
    for doc in sys.argv[2:]:
        text = (src / doc).read_text(encoding="utf-8")
        for m in re.finditer(r"`([^`\s]+)`", text):
            word = m.group(1)
            if not word.startswith(TOPS) or "*" in word or "<" in word or "$" in word:
                continue
            word = re.sub(r"(:\d+(-\d+)?|#.*)$", "", word).rstrip(".,;")
            for path in expand(word):
                named += 1
                # From the repository's root, or from the document's folder
                # (a package's README names its own files).
                if not (src / path).exists() and not ((src / doc).parent / path).exists():
                    line = text.count("\n", 0, m.start()) + 1
                    missing.append(f"{doc}:{line}: {path}")
    for m in missing:
        print("missing:", m, file=sys.stderr)
    print(f"{named} paths named in {len(sys.argv) - 2} documents, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
