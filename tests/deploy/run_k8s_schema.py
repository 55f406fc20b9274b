#!/usr/bin/python3
"""Validates docker/k8s/*.yaml against the Kubernetes API schemas with the
kubernetes-models npm package (pinned in package-lock.json here), installed
with `npm ci` into WORK_DIR (the build tree) the first time. Works offline
once installed. Exits 77 (ctest: skipped) when node or npm is missing or the
package cannot be installed. With kustomize or kubectl on the PATH it also
validates docker/k8s-regions as rendered (`kubectl kustomize`, offline): the
patched Deployment with its client container; without them it says so and
checks the base only.

  run_k8s_schema.py WORK_DIR
"""
import filecmp
import json
import os
import pathlib
import shutil
import subprocess
import sys

import yaml

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SKIP = 77


def skip(why):
    print(f"SKIPPED: {why}")
    return SKIP


def ensure_modules(work, npm):
    lock = work / "package-lock.json"
    modules = work / "node_modules"
    if modules.is_dir() and lock.exists() and filecmp.cmp(lock, HERE / "package-lock.json", shallow=False):
        return modules, None
    work.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(HERE / name, work / name)
    try:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
                       cwd=work, check=True, timeout=180, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        out = getattr(e, "stdout", b"") or b""
        shutil.rmtree(modules, ignore_errors=True)
        (work / "package-lock.json").unlink(missing_ok=True)
        return None, f"npm ci failed (no registry?): {out.decode(errors='replace')[-500:]}"
    return modules, None


def rendered_overlay(path):
    """The objects of the kustomization at `path`, rendered; [] (with a note)
    when neither kustomize nor kubectl is here; None when rendering fails."""
    label = f"{path.name} (rendered)"
    if shutil.which("kustomize"):
        cmd = ["kustomize", "build", str(path)]
    elif shutil.which("kubectl"):
        cmd = ["kubectl", "kustomize", str(path)]
    else:
        print(f"{label}: not checked (no kustomize or kubectl to render it)")
        return []
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if p.returncode != 0:
        print(f"{label}: {' '.join(cmd)} failed (exit {p.returncode}): {p.stderr.decode(errors='replace')[-500:]}")
        return None
    return [{"file": label, "object": o} for o in yaml.safe_load_all(p.stdout) if o]


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    node = os.environ.get("DGMM_NODE") or shutil.which("node")
    npm = os.environ.get("DGMM_NPM") or shutil.which("npm")
    if not node or not npm:
        return skip("node or npm not found")
    modules, why = ensure_modules(pathlib.Path(argv[0]).resolve(), npm)
    if modules is None:
        return skip(why)
    entries = []
    for path in sorted((ROOT / "docker" / "k8s").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if obj and obj.get("kind") != "Kustomization":
                entries.append({"file": path.name, "object": obj})
    if not entries:
        print("no Kubernetes objects found in docker/k8s")
        return 1
    overlay = rendered_overlay(ROOT / "docker" / "k8s-regions")
    if overlay is None:
        return 1
    entries += overlay
    result = subprocess.run([node, str(HERE / "k8s_schema.mjs"), str(modules)],
                            input=json.dumps(entries).encode(), timeout=60)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
