#!/usr/bin/python3
"""Checks the folder order of service/ and that no files import each other in
a loop (docs/architecture.md section 1).

- service/'s folders stand in one order (ORDER below); a file includes only
  files of its own folder or of folders before it. The files directly in
  service/ (the server, its flags, the metrics endpoint, main.cc) come last.
- service/engine/ names no proto type (v1::..., dgmm.pb.h): the RPC layer
  writes what the engine says into its replies.
- No C++ file of service/, client/, util/ or proto/ reaches itself through its
  includes, and no Python module of client/python or JavaScript file of
  client/node reaches itself through its relative imports.

Usage: check_order.py SOURCE_DIR
"""
import pathlib
import re
import sys

ORDER = ["core", "backends", "engine", "regions", "pipeline", "job", "rpc", ""]
CXX = {".h", ".cc", ".cu", ".cuh"}


def folder(rel):
    """The service/ folder a path under service/ belongs to ("" for the top)."""
    parts = pathlib.PurePosixPath(rel).parts
    return parts[1] if len(parts) > 2 else ""


def cxx_graph(src):
    graph = {}
    for top in ("service", "client", "util", "proto"):
        for path in (src / top).rglob("*"):
            if path.suffix not in CXX or "node_modules" in path.parts or "gen" in path.parts:
                continue
            rel = path.relative_to(src).as_posix()
            deps = []
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                # Paths from the root, or (the C++ client's) from client/cpp/.
                for cand in (inc, f"client/cpp/{inc}", f"client/cpp/include/{inc}"):
                    if (src / cand).is_file():
                        deps.append(cand)
                        break
            graph[rel] = deps
    return graph


def import_graph(src, root, pattern, resolve):
    graph = {}
    base = src / root
    if not base.is_dir():
        return graph
    for path in base.rglob("*"):
        if "node_modules" in path.parts or not path.is_file():
            continue
        if path.suffix not in (".py", ".js", ".mjs", ".cjs"):
            continue
        rel = path.relative_to(src).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        deps = []
        for m in re.finditer(pattern, text, re.M):
            target = resolve(path, m.group(1))
            if target is not None and target.is_file():
                deps.append(target.relative_to(src).as_posix())
        graph[rel] = deps
    return graph


def resolve_py(path, name):
    # from .x import y / from . import x
    dots = len(name) - len(name.lstrip("."))
    rest = name[dots:]
    base = path.parent
    for _ in range(dots - 1):
        base = base.parent
    if not rest:
        return None
    cand = base / (rest.replace(".", "/") + ".py")
    if cand.is_file():
        return cand
    cand = base / rest.replace(".", "/") / "__init__.py"
    return cand if cand.is_file() else None


def resolve_js(path, name):
    if not name.startswith("."):
        return None
    cand = (path.parent / name).resolve()
    for c in (cand, cand.with_suffix(".js"), cand / "index.js"):
        if c.is_file():
            return c
    return None


def cycles(graph):
    """One loop per strongly connected component of more than one file (or a
    file that includes itself)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, []):
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    src = pathlib.Path(sys.argv[1]).resolve()
    failures = []
    graph = cxx_graph(src)
    service_files = [f for f in graph if f.startswith("service/")]
    for f in sorted(service_files):
        mine = folder(f)
        if mine not in ORDER:
            failures.append(f"{f}: folder service/{mine}/ is not in the order {ORDER}")
            continue
        for dep in graph[f]:
            if not dep.startswith("service/"):
                continue
            theirs = folder(dep)
            if theirs in ORDER and ORDER.index(theirs) > ORDER.index(mine):
                failures.append(f"{f} includes {dep}: service/{theirs or '.'} comes after "
                                f"service/{mine or '.'} in the order")
    # The engine knows no proto type: the RPC layer puts what it says on the wire.
    for f in sorted(service_files):
        if folder(f) != "engine":
            continue
        text = (src / f).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if re.search(r"\bv1::|dgmm\.pb\.h", line.split("//")[0]):
                failures.append(f"{f}:{number}: the engine names a proto type: {line.strip()}")
    for comp in cycles(graph):
        failures.append("C++ files include each other in a loop: " + ", ".join(comp))
    py = import_graph(src, "client/python", r"^\s*from\s+(\.[\w.]*)\s+import", resolve_py)
    js = import_graph(src, "client/node", r"""require\(\s*['"]([^'"]+)['"]\s*\)""", resolve_js)
    for comp in cycles(py) + cycles(js):
        failures.append("files import each other in a loop: " + ", ".join(comp))
    for f in failures:
        print("layering:", f, file=sys.stderr)
    if failures:
        return 1
    print(f"layering: {len(service_files)} service files in the order "
          f"{' < '.join(o or 'top' for o in ORDER)}; {len(graph) + len(py) + len(js)} files, "
          "no loops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
