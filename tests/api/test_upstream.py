"""``api/upstream.toml`` is the one place the upstream releases are named: every go.mod pin, the
kubelet protos' source line, every recorded oracle file and every sentence of the docs that
names a release must agree with it, and the values derived from it are what the code uses."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from api.gates import LATEST_KUBERNETES
from api.upstream import UPSTREAM, parse, staging
from sharegpuctl.local.apiserver.validation import SCHEMA_KUBERNETES_VERSION
from tests.e2e.binaries import KUBERNETES_PINS, kubernetes_version, pinned_version
from tests.oracle import upstream as oracle
from tests.paths import DATA_DIR, REPO_ROOT

K, P = UPSTREAM.kubernetes, UPSTREAM.kubernetes_previous
PINS = REPO_ROOT / "tests" / "e2e" / "upstream"
PREVIOUS_PINS = PINS / f"kubernetes-{P.rsplit('.', 1)[0]}" / "go.mod"
#: go.mod files of Kubernetes' modules, with the release each pins.
KUBERNETES_GOMODS = {
    KUBERNETES_PINS: K,
    PREVIOUS_PINS: P,
    PINS / "test-driver" / "go.mod": K,
    oracle.SOURCE_DIR / "go.mod": K,
}
#: Hand-written files whose prose names the pinned releases (docs/performance.md is left out:
#: each figure there names the release it was measured on; api/upstream.py's examples name
#: none).
PROSE = sorted(
    {
        REPO_ROOT / "README.md",
        REPO_ROOT / "Makefile",
        *(REPO_ROOT / "docs").glob("*.md"),
        *(REPO_ROOT / "api").glob("*.py"),
        *(REPO_ROOT / "bench").glob("*.py"),
        *(REPO_ROOT / "kubeletplugin").rglob("*.proto"),
    }
    - {REPO_ROOT / "docs" / "performance.md", REPO_ROOT / "api" / "upstream.py"}
)
#: A Kubernetes patch release (``v1.37.2``, ``1.36.3``), and a staging module's (``v0.37.2``);
#: not a pre-release (``v1.38.0-beta.0``).
RELEASE = re.compile(r"(?<![\w.])v?(1\.[2-4]\d\.\d+)(?![\w.]*\+sharegpu)(?![\d.-])")
STAGING = re.compile(r"(?<![\w.])(v0\.[2-4]\d\.\d+)(?![\d.-])")
#: Mentions that name no pin: the chart's and kind's oldest release, and the CEL test tables'
#: cel-go source (tests/cel/upstream/, a version of its own).
NOT_A_PIN = re.compile(r"(kindest/node:|>=|cel-go )$")


def gomod_pairs(gomod: Path) -> list[tuple[str, str]]:
    """Every ``(module, version)`` of ``gomod``'s require lines and replace lines' right-hand
    sides."""
    found = []
    for line in gomod.read_text().splitlines():
        words = line.split("//")[0].split()
        if words[:1] in (["require"], ["replace"]):
            words = words[1:]
        if "=>" in words:
            words = words[words.index("=>") + 1 :]
        if len(words) == 2 and "/" in words[0] and words[1].startswith("v"):
            found.append((words[0], words[1]))
    return found


def gomod_requires(gomod: Path) -> dict[str, str]:
    """Module -> version of ``gomod`` (a replacement's version where one is given)."""
    return dict(gomod_pairs(gomod))


def wire(proto: str) -> set[tuple[str, ...]]:
    """What a .proto file fixes on the wire: each message's, enum's and service's fields (type,
    name, number), values and rpcs, by their enclosing names; comments and options left out."""
    text = re.sub(r"//[^\n]*", "", proto)
    out: set[tuple[str, ...]] = set()
    stack: list[str] = []
    for tok in re.finditer(
        r"(message|enum|service)\s+(\w+)\s*\{|\}"
        r"|rpc\s+(\w+)\s*\(\s*(\w+)\s*\)\s*returns\s*\(\s*(\w+)\s*\)"
        r"|(?:repeated\s+|optional\s+)?(map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*(\d+)"
        r"|(\w+)\s*=\s*(\d+)\s*;",
        text,
    ):
        if tok.group(1):
            stack.append(tok.group(2))
        elif tok.group(0) == "}":
            if stack:
                stack.pop()
        elif tok.group(3):
            out.add((".".join(stack), "rpc", tok.group(3), tok.group(4), tok.group(5)))
        elif tok.group(7):
            out.add((".".join(stack), tok.group(6).replace(" ", ""), tok.group(7), tok.group(8)))
        elif tok.group(9):
            out.add((".".join(stack), "value", tok.group(9), tok.group(10)))
    return out


def test_the_pin_file_parses_and_refuses_what_it_must() -> None:
    text = (REPO_ROOT / "api" / "upstream.toml").read_text()
    assert parse(text) == UPSTREAM
    with pytest.raises(ValueError, match=r'etcd: want a version "X.Y.Z", got \'v3.6.16\''):
        parse(text.replace('etcd = "3.6.16"', 'etcd = "v3.6.16"'))
    with pytest.raises(ValueError, match=r"unknown keys \['kubelet'\]"):
        parse(text + 'kubelet = "1.37.2"\n')
    with pytest.raises(ValueError, match=r"kubernetes-previous: 1\.38\.0 is not older"):
        parse(text.replace(f'kubernetes-previous = "{P}"', 'kubernetes-previous = "1.38.0"'))
    with pytest.raises(ValueError, match="containerd: want"):
        parse(text.replace('containerd = "2.2.1"\n', ""))


def test_what_the_code_derives_from_it() -> None:
    assert LATEST_KUBERNETES == UPSTREAM.minor == tuple(int(p) for p in K.split(".")[:2])
    assert "{}.{}.0".format(*UPSTREAM.minor) == SCHEMA_KUBERNETES_VERSION
    assert kubernetes_version() == f"v{K}" or kubernetes_version() == f"v{P}"
    assert oracle.pinned_version() == staging(K)
    assert staging("1.38.0") == "v0.38.0"


@pytest.mark.parametrize("gomod", list(KUBERNETES_GOMODS), ids=lambda p: str(p.parent.name))
def test_each_kubernetes_gomod_pins_the_release_and_its_staging_modules(gomod: Path) -> None:
    """k8s.io/kubernetes at the release, and every staging module it requires or replaces at
    the release's ``v0.Y.Z`` (k8s.io/kubernetes itself requires them at v0.0.0)."""
    release = KUBERNETES_GOMODS[gomod]
    if gomod != oracle.SOURCE_DIR / "go.mod":
        assert pinned_version(gomod) == f"v{release}"
    staged = [
        (m, v)
        for m, v in gomod_pairs(gomod)
        if m.startswith("k8s.io/") and re.fullmatch(r"v0\.\d+\.\d+", v) and v != "v0.0.0"
    ]
    wrong = [(m, v) for m, v in staged if v != staging(release)]
    assert staged and not wrong, f"{gomod}: staging modules not at {staging(release)}: {wrong}"
    requires = gomod_requires(gomod)
    if release == K and "github.com/google/cel-go" in requires:
        assert requires["github.com/google/cel-go"] == f"v{UPSTREAM.cel_go}", gomod


def test_the_oracle_and_the_cluster_use_the_pinned_cel_go() -> None:
    for gomod in (KUBERNETES_PINS, oracle.SOURCE_DIR / "go.mod"):
        assert gomod_requires(gomod)["github.com/google/cel-go"] == f"v{UPSTREAM.cel_go}"


def test_etcd_and_containerd_are_pinned_as_named() -> None:
    etcd = gomod_requires(PINS / "etcd" / "go.mod")
    assert etcd["go.etcd.io/etcd/server/v3"] == f"v{UPSTREAM.etcd}"
    wrong = {m: v for m, v in etcd.items() if m.startswith("go.etcd.io/etcd/")}
    assert set(wrong.values()) == {f"v{UPSTREAM.etcd}"}, wrong
    containerd = gomod_requires(PINS / "containerd" / "go.mod")
    assert containerd["github.com/containerd/containerd/v2"] == f"v{UPSTREAM.containerd}"


def test_the_kubelet_protos_name_their_source_release() -> None:
    sources = [
        (proto.name, version)
        for proto in sorted((REPO_ROOT / "kubeletplugin").rglob("*.proto"))
        for version in re.findall(r"k8s\.io/kubelet (v[\d.]+\d)", proto.read_text())
    ]
    assert sources and all(v == staging(K) for _, v in sources), sources


#: Our protos and upstream's, in k8s.io/kubelet's pkg/apis.
PROTOS = {
    "dra_v1.proto": "dra/v1",
    "dra_v1beta1.proto": "dra/v1beta1",
    "drahealth_v1.proto": "dra-health/v1",
    "drahealth_v1alpha1.proto": "dra-health/v1alpha1",
    "pluginregistration_v1.proto": "pluginregistration/v1",
}


@pytest.mark.parametrize("name", list(PROTOS))
def test_the_kubelet_protos_are_wire_identical_to_the_pinned_release(name: str) -> None:
    """Against k8s.io/kubelet of the pinned release in the e2e build's module cache (there
    once ``python -m tests.e2e.binaries`` has run)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    module = base / "sharegpu-e2e" / "gomod" / "k8s.io" / f"kubelet@{staging(K)}"
    if not module.is_dir():
        pytest.skip(f"k8s.io/kubelet {staging(K)} is not in the module cache")
    ours = wire((REPO_ROOT / "kubeletplugin/kubelet/grpcapi/proto" / name).read_text())
    source = module / "pkg" / "apis" / PROTOS[name] / "api.proto"
    assert source.is_file(), f"k8s.io/kubelet {staging(K)} has no {PROTOS[name]}/api.proto"
    theirs = wire(source.read_text())
    assert ours and ours == theirs, (sorted(ours - theirs), sorted(theirs - ours))


def test_the_wire_comparison_sees_a_changed_field_number() -> None:
    proto = "message M {\n  string uid = 1; // the claim\n  repeated Device devices = 2;\n}\n"
    assert wire(proto) == {("M", "string", "uid", "1"), ("M", "Device", "devices", "2")}
    assert wire(proto) != wire(proto.replace("= 2", "= 3"))


def test_recorded_oracle_files_name_the_pinned_release() -> None:
    """Re-recorded by ``python -m tests.oracle.regressions --rerecord`` and
    ``SHAREGPU_E2E_RECORD_ORACLE=1 make e2e``."""
    dra = sorted((DATA_DIR / "dra-oracle").glob("*.json"))
    apiserver = sorted((DATA_DIR / "apiserver-oracle").glob("*.json"))
    assert dra and apiserver
    stale = [
        p.name
        for p in dra
        if json.loads(p.read_text())["answeredBy"] != (f"{oracle.ALLOCATOR_MODULE} {staging(K)}")
    ]
    stale += [
        p.name for p in apiserver if json.loads(p.read_text())["kubernetesVersion"] != f"v{K}"
    ]
    assert not stale, f"recorded with another release than {K}: {stale}"


def test_prose_names_only_the_pinned_releases() -> None:
    """A sentence that names a Kubernetes patch release, a staging module's version, the etcd or
    the containerd release names a pinned one."""
    allowed = {K, P}
    wrong: list[str] = []
    for path in PROSE:
        text = path.read_text()
        checks = [
            (RELEASE, allowed),
            (STAGING, {staging(v) for v in allowed}),
            (re.compile(r"\betcd(?:/server/v3`?)? v(\d+\.\d+\.\d+)"), {UPSTREAM.etcd}),
            (re.compile(r"\bcontainerd v(\d+\.\d+\.\d+)"), {UPSTREAM.containerd}),
            (re.compile(r"v(\d+\.\d+\.\d+)\+sharegpu"), {SCHEMA_KUBERNETES_VERSION}),
        ]
        for pattern, good in checks:
            for match in pattern.finditer(text):
                before = text[max(0, match.start() - 20) : match.start()]
                if match.group(1) not in good and not NOT_A_PIN.search(before):
                    line = text.count("\n", 0, match.start()) + 1
                    wrong.append(f"{path.relative_to(REPO_ROOT)}:{line}: {match.group(0)}")
    assert not wrong, "releases other than api/upstream.toml's:\n" + "\n".join(wrong)


def test_the_prose_patterns_find_what_they_must() -> None:
    """The patterns are no formality: they find a release, a staging version and the embedded
    server's version, and leave the oldest-release mentions alone."""
    text = (
        f"Kubernetes v{K} and `make e2e K8S={P}`; k8s.io/api {staging(K)}; "
        "kindest/node:v1.30.0, kubeVersion >=1.34.0, `v1.37.0+sharegpu`, cel-go v0.26.0, "
        "v1.38.0-beta.0"
    )
    found = [
        (m.group(1), NOT_A_PIN.search(text[: m.start()]) is None) for m in RELEASE.finditer(text)
    ]
    assert found == [(K, True), (P, True), ("1.30.0", False), ("1.34.0", False)]
    staged = [
        (m.group(1), NOT_A_PIN.search(text[: m.start()]) is None) for m in STAGING.finditer(text)
    ]
    assert staged == [(staging(K), True), ("v0.26.0", False)]
