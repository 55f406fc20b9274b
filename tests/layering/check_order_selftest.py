#!/usr/bin/python3
"""check_order.py fails on trees that break its rules, and passes a tree that
keeps them: an include that runs back up the folder order, a C++ include
loop, and a Python and a JavaScript import loop, each in a tree of its own.

Usage: check_order_selftest.py CHECK_ORDER_PY
"""
import pathlib
import subprocess
import sys
import tempfile

CASES = {
    "clean": ({"service/core/a.h": "", "service/job/b.h": '#include "service/core/a.h"\n'}, 0,
              None),
    "back include": ({"service/core/a.h": '#include "service/job/b.h"\n',
                      "service/job/b.h": ""}, 1, "comes after"),
    "proto in the engine": ({"service/engine/e.h": "v1::JobStats stats;\n"}, 1,
                            "names a proto type"),
    "C++ loop": ({"service/job/a.h": '#include "service/job/b.h"\n',
                  "service/job/b.h": '#include "service/job/a.h"\n'}, 1, "C++ files include"),
    "Python loop": ({"client/python/dgmm/a.py": "from .b import x\n",
                     "client/python/dgmm/b.py": "from .a import y\n"}, 1, "import each other"),
    "JavaScript loop": ({"client/node/a.js": "const b = require('./b');\n",
                         "client/node/b.js": "const a = require('./a.js');\n"}, 1,
                        "import each other"),
}


def main():
    check = sys.argv[1]
    failed = False
    for name, (files, want_rc, want_text) in CASES.items():
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            for top in ("service", "client", "util", "proto"):
                (root / top).mkdir()
            for rel, text in files.items():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_text(text)
            run = subprocess.run([sys.executable, check, d], capture_output=True, text=True)
            ok = run.returncode == want_rc and (want_text is None or want_text in run.stderr)
            print(f"{name}: rc {run.returncode} {'as expected' if ok else 'WRONG'}")
            if not ok:
                print(run.stdout, run.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
