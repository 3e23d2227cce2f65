"""The ``resource.k8s.io`` API versions each supported Kubernetes release has, and which of them
kube-apiserver serves by default; the others it serves only when enabled with its flag
``--runtime-config=resource.k8s.io/<version>=true``.

One table, :data:`RESOURCE_API_VERSIONS`, read from each release's kube-apiserver:
``pkg/controlplane/instance.go`` lists ``resource.k8s.io/v1`` among the stable versions enabled
by default, ``v1beta1`` and ``v1beta2`` among the beta versions disabled by default and
``v1alpha3`` among the alpha versions (v1.36.3 and v1.37.2 read directly; 1.34 and 1.35 have the
same lists: since 1.24 a new beta API is off by default, KEP-3136, and v1beta1 and v1beta2 date
from 1.32 and 1.33). A manifest in a version the target release does not serve is refused by
its API server: ``no matches for kind "ResourceClaim" in version "resource.k8s.io/v1beta1"``.

Invariant: every release of :data:`api.gates.LATEST_KUBERNETES`'s supported range is a key, and
its ``served`` and ``disabled`` versions are disjoint.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from api.gates import Version
from api.names import RESOURCE_GROUP

#: kube-apiserver's flag that enables an API version that is off by default.
RUNTIME_CONFIG_FLAG: Final = "--runtime-config"


@dataclass(frozen=True)
class ReleaseApiVersions:
    """The ``resource.k8s.io`` versions of one release: served by default, and compiled in but
    off unless ``--runtime-config`` enables them."""

    served: tuple[str, ...]
    disabled: tuple[str, ...]


_V1_ONLY: Final = ReleaseApiVersions(served=("v1",), disabled=("v1beta2", "v1beta1", "v1alpha3"))

#: ``(major, minor)`` -> the ``resource.k8s.io`` versions of that release.
RESOURCE_API_VERSIONS: Final[Mapping[Version, ReleaseApiVersions]] = {
    (1, 34): _V1_ONLY,
    (1, 35): _V1_ONLY,
    (1, 36): _V1_ONLY,
    (1, 37): _V1_ONLY,
}


def served_versions(release: Version, enabled: Collection[str] = ()) -> tuple[str, ...] | None:
    """The ``resource.k8s.io`` versions ``release`` serves, with the ``group/version`` strings
    of ``enabled`` (``--runtime-config``) that it has; None for a release not in the table."""
    versions = RESOURCE_API_VERSIONS.get(release)
    if versions is None:
        return None
    extra = [v for v in versions.disabled if f"{RESOURCE_GROUP}/{v}" in enabled]
    return (*versions.served, *extra)


def unserved_problem(
    api_version: str, release: Version, enabled: Collection[str] = ()
) -> str | None:
    """Why a ``resource.k8s.io`` object in ``api_version`` cannot be applied to ``release``
    (naming the versions it serves, and how to enable one it has but does not serve); None when
    it can, or when the group is another or the release is not in the table."""
    group, _, version = api_version.partition("/")
    served = served_versions(release, enabled)
    if group != RESOURCE_GROUP or served is None or version in served:
        return None
    name = "{}.{}".format(*release)
    listed = ", ".join(f"{RESOURCE_GROUP}/{v}" for v in served)
    if version in RESOURCE_API_VERSIONS[release].disabled:
        how = (
            f"; its API server serves {api_version} only with {RUNTIME_CONFIG_FLAG}="
            f"{api_version}=true (pass the same to this command if yours does)"
        )
    else:
        how = f"; Kubernetes {name} has no {api_version}"
    return f"Kubernetes {name} does not serve {api_version} (it serves {listed}){how}"
