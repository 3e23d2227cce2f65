"""Rewrite the Go pins from ``api/upstream.toml``: ``python -m tests.upstream_pins``.

For each module the project pins (``tests/e2e/upstream/*``, ``tests/oracle/upstream``) it sets
the release the pin file names and lets ``go mod tidy`` settle the rest:

* ``kubernetes/`` and ``test-driver/``: ``k8s.io/kubernetes`` at ``kubernetes``, and a
  ``replace`` of every staging module the release's own go.mod replaces (read from the module
  cache, so a module new in the release is covered) by its published ``v0.Y.Z``;
* ``kubernetes-<minor>/`` of ``kubernetes-previous``: kept when it already pins that release;
  else copied from ``kubernetes/`` when that pinned it before this run (the step that moves a
  release from the first place to the second); the other ``kubernetes-*`` directories removed;
* ``tests/oracle/upstream``: ``k8s.io/api``, ``k8s.io/apimachinery`` and
  ``k8s.io/dynamic-resource-allocation`` at the staging version;
* ``etcd/`` and ``containerd/``: their server module at ``etcd`` and ``containerd``.

It prints the cel-go version the release's modules require (the pin file's ``cel-go`` must say
the same; ``tests/api/test_upstream.py`` checks it). Go runs with the module caches of the build
script and the oracle, ``GOFLAGS=-mod=mod``, ``GOTOOLCHAIN=local``; ``--root`` rewrites another
checkout (a scratch copy for a dry run). Exit 1 with the failing command's output on error.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from api.upstream import Upstream, parse, staging
from tests.paths import REPO_ROOT

KUBERNETES: Final = "k8s.io/kubernetes"
ORACLE_MODULES: Final = ("k8s.io/api", "k8s.io/apimachinery", "k8s.io/dynamic-resource-allocation")
ETCD: Final = "go.etcd.io/etcd/server/v3"
CONTAINERD: Final = "github.com/containerd/containerd/v2"
CEL_GO: Final = "github.com/google/cel-go"
#: What tests/e2e/build-binaries.sh builds from kubernetes/ besides its go.mod's tools: their
#: go.sum entries are kept (go mod tidy keeps only the tools').
BUILT_BESIDE_TOOLS: Final = ("k8s.io/kubernetes/cmd/kube-proxy",)


class PinError(RuntimeError):
    """A Go command failed; the message holds the command and its output."""


def cache_dir(name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / name


def go(directory: Path, cache: Path, *args: str) -> str:
    """``go args`` in ``directory`` with ``cache``'s module and build caches."""
    env = {
        **os.environ,
        "GOMODCACHE": str(cache / "gomod"),
        "GOCACHE": str(cache / "gocache"),
        "GOFLAGS": "-mod=mod",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    done = subprocess.run(
        ["go", *args], cwd=directory, env=env, capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise PinError(f"cd {directory} && go {' '.join(args)}:\n{done.stderr.strip()}")
    return done.stdout


def required(gomod: Path, module: str) -> str | None:
    """The version ``gomod`` requires of ``module``; None when it does not."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", gomod.read_text(), re.M)
    return match.group(1) if match else None


def staging_modules(directory: Path, cache: Path, release: str) -> list[str]:
    """The staging modules ``k8s.io/kubernetes`` ``v<release>`` requires and replaces with its
    own tree (read from its go.mod in the module cache, downloaded first)."""
    go(directory, cache, "mod", "download", f"{KUBERNETES}@v{release}")
    mod = (
        cache / "gomod" / "cache" / "download" / "k8s.io" / "kubernetes" / "@v" / f"v{release}.mod"
    )
    text = mod.read_text()
    staged = set(re.findall(r"(k8s\.io/[\w.-]+) => \./staging/", text))
    # Those it requires (at v0.0.0): the sample modules of the tree are left out.
    return sorted(staged & set(re.findall(r"^\s+(k8s\.io/[\w.-]+) v0\.0\.0\s*$", text, re.M)))


def layout(gomod: str, release: str) -> str:
    """The committed layout of a Kubernetes go.mod: the release on a require line of its own
    before the other requirements, the single-line replaces ``go mod edit`` writes gathered
    into one ``replace ( ... )`` block, and the tools last."""
    line = f"\t{KUBERNETES} v{release} // indirect\n"
    if line in gomod:
        own = f"require {KUBERNETES} v{release} // indirect\n\nrequire ("
        gomod = gomod.replace(line, "", 1).replace("require (", own, 1)
    single = re.findall(r"^replace (\S+ => \S+ \S+)\n\n?", gomod, re.M)
    if single:
        gomod = re.sub(r"^replace \S+ => \S+ \S+\n\n?", "", gomod, flags=re.M).rstrip("\n")
        gomod += "\n\nreplace (\n" + "".join(f"\t{r}\n" for r in single) + ")\n"
    tools = re.search(r"^tool (?:\(\n(?:\t\S+\n)*\)|\S+)\n\n?", gomod, re.M)
    if tools:
        stanza = tools.group(0).rstrip("\n")
        gomod = (gomod[: tools.start()] + gomod[tools.end() :]).rstrip("\n") + f"\n\n{stanza}\n"
    return gomod


def drop_indirect(directory: Path, cache: Path) -> None:
    """Drop every ``// indirect`` requirement of ``directory``'s go.mod, so that the next
    ``go mod tidy`` chooses each anew from what the pinned modules require (a version left over
    from another release would otherwise stay: tidy never lowers one)."""
    gomod = (directory / "go.mod").read_text()
    indirect = re.findall(r"^\s*(?:require\s+)?(\S+) v\S+ // indirect$", gomod, re.M)
    if indirect:
        go(directory, cache, "mod", "edit", *(f"-droprequire={m}" for m in indirect))


def pin_kubernetes(directory: Path, cache: Path, release: str, built: tuple[str, ...] = ()) -> None:
    """``directory``'s go.mod at ``k8s.io/kubernetes`` ``release``, staging modules replaced;
    ``built``: more packages whose go.sum entries the build needs."""
    gomod = (directory / "go.mod").read_text()
    old = re.findall(r"^\s*(?:replace\s+)?(k8s\.io/[\w.-]+) =>", gomod, re.M)
    if old:
        go(directory, cache, "mod", "edit", *(f"-dropreplace={m}" for m in old))
    drop_indirect(directory, cache)
    edits = [f"-require={KUBERNETES}@v{release}"]
    for module in staging_modules(directory, cache, release):
        edits.append(f"-replace={module}={module}@{staging(release)}")
    go(directory, cache, "mod", "edit", *edits)
    go(directory, cache, "mod", "tidy")
    if built:
        go(directory, cache, "list", "-deps", *built)
    path = directory / "go.mod"
    path.write_text(layout(path.read_text(), release))


def write(root: Path, pins: Upstream) -> list[str]:
    """Rewrite every pinned module under ``root``; returns what it did, one line each."""
    upstream = root / "tests" / "e2e" / "upstream"
    e2e, oracle_cache = cache_dir("sharegpu-e2e"), cache_dir("sharegpu-oracle")
    done = []
    main = upstream / "kubernetes"
    was = required(main / "go.mod", KUBERNETES)
    previous = upstream / f"kubernetes-{pins.kubernetes_previous.rsplit('.', 1)[0]}"
    if not previous.is_dir() or required(previous / "go.mod", KUBERNETES) != (
        f"v{pins.kubernetes_previous}"
    ):
        if was != f"v{pins.kubernetes_previous}":
            raise PinError(
                f"{previous.relative_to(root)} does not pin {pins.kubernetes_previous} and "
                f"kubernetes/ pins {was}: pin the previous release by hand (copy a go.mod that "
                "requires it) or name the release kubernetes/ pinned"
            )
        shutil.rmtree(previous, ignore_errors=True)
        shutil.copytree(main, previous)
        done.append(f"{previous.name}: copied from kubernetes/ ({was})")
    for other in sorted(upstream.glob("kubernetes-*")):
        if other != previous:
            shutil.rmtree(other)
            done.append(f"{other.name}: removed")
    for directory in (main, upstream / "test-driver"):
        pin_kubernetes(
            directory, e2e, pins.kubernetes, BUILT_BESIDE_TOOLS if directory == main else ()
        )
        done.append(f"{directory.name}: {KUBERNETES} v{pins.kubernetes}")
    oracle = root / "tests" / "oracle" / "upstream"
    version = staging(pins.kubernetes)
    drop_indirect(oracle, oracle_cache)
    go(oracle, oracle_cache, "get", *(f"{m}@{version}" for m in ORACLE_MODULES))
    go(oracle, oracle_cache, "mod", "tidy")
    done.append(f"oracle: {', '.join(ORACLE_MODULES)} {version}")
    for name, module, release in (
        ("etcd", ETCD, pins.etcd),
        ("containerd", CONTAINERD, pins.containerd),
    ):
        go(upstream / name, e2e, "get", f"{module}@v{release}")
        go(upstream / name, e2e, "mod", "tidy")
        done.append(f"{name}: {module} v{release}")
    cel = {required(g, CEL_GO) for g in (main / "go.mod", oracle / "go.mod")}
    done.append(
        f"cel-go the release requires: {', '.join(sorted(v or '-' for v in cel))} "
        f"(api/upstream.toml: v{pins.cel_go})"
    )
    return done


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m tests.upstream_pins``."""
    parser = argparse.ArgumentParser(prog="python -m tests.upstream_pins", description=__doc__)
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the checkout to rewrite")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pin_file = args.root / "api" / "upstream.toml"
    try:
        pins = parse(pin_file.read_text(), str(pin_file))
        for line in write(args.root, pins):
            print(line, flush=True)
    except (ValueError, PinError) as exc:
        print(f"upstream pins: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
