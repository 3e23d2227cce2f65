"""The official client's connection code (kubeconfig, exec plugins, OIDC, in-cluster account,
token refresh), loaded with as little of the ``kubernetes`` package as possible, and
:class:`ApiConnection`, what the node daemon holds instead of an ``ApiClient``.

:func:`official` returns the pieces used (:class:`Official`): from ``kubernetes`` when it is
already imported; else from only the modules that define them, imported under empty namespace
packages that are removed from ``sys.modules`` afterwards (so a later ``import kubernetes`` runs
as usual; a plain ``import kubernetes`` costs about 37 MiB and a quarter second); else, when that
fails, from the whole package. Invariants: each part is imported when first used and once per
process; light or full is decided once, at the first import; the daemons load their connection
at start-up, before other threads run (the namespaces are visible meanwhile)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    import urllib3
    from kubernetes.client import Configuration

#: User-Agent of the requests sent through an :class:`ApiConnection`.
USER_AGENT: Final = "sharegpu"
#: Packages registered as namespaces while a light import runs (their ``__init__`` skipped).
_PACKAGES: Final = ("kubernetes", "kubernetes.client", "kubernetes.config", "kubernetes.utils")
_CONFIGURATION: Final = "kubernetes.client.configuration"


class _NoApiClient:
    """Stands for ``kubernetes.client.ApiClient`` in a lightly loaded ``kube_config`` module
    (its ``new_client_from_config`` helpers, which sharegpu never calls, would need it)."""

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise RuntimeError("kubernetes.client.ApiClient is not loaded (use the full package)")


class _Modules:
    """Modules of the official client by name, each imported once, on first use: lightly
    (the module docstring) unless ``full`` or ``kubernetes`` was already imported when the first
    one was asked for, or a light import failed."""

    def __init__(self, full: bool) -> None:
        self._lock = threading.Lock()
        self._full: bool | None = True if full else None
        self._loaded: dict[str, types.ModuleType] = {}

    @property
    def full(self) -> bool:
        """Whether the modules come from the whole package (decided at the first import)."""
        return self._full is True

    def get(self, name: str) -> types.ModuleType:
        with self._lock:
            if name not in self._loaded:
                if self._full is None:
                    self._full = "kubernetes" in sys.modules
                if not self._full:
                    try:
                        self._import_light(name)
                    except (ImportError, AttributeError):
                        self._full = True
                if self._full:
                    importlib.import_module("kubernetes")
                    self._loaded[name] = importlib.import_module(name)
            return self._loaded[name]

    def _import_light(self, name: str) -> None:
        spec = importlib.util.find_spec("kubernetes")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("the kubernetes package is not installed")
        root = next(iter(spec.submodule_search_locations))
        before = set(sys.modules)
        try:
            for package_name in _PACKAGES:
                package = types.ModuleType(package_name)
                package.__path__ = [os.path.join(root, *package_name.split(".")[1:])]
                sys.modules[package_name] = package
            sys.modules.update(self._loaded)  # what earlier light imports loaded: reused
            client_package = sys.modules["kubernetes.client"]
            configuration = importlib.import_module(_CONFIGURATION).Configuration
            client_package.Configuration = configuration  # type: ignore[attr-defined]
            client_package.ApiClient = _NoApiClient  # type: ignore[attr-defined]
            importlib.import_module(name)
            self._loaded.update(
                (n, m)
                for n, m in sys.modules.items()
                if n.startswith("kubernetes.") and n not in _PACKAGES
            )
        finally:
            for added in set(sys.modules) - before:
                if added.split(".")[0] == "kubernetes":
                    del sys.modules[added]


class Official:
    """What sharegpu uses of the official client, each part imported when first used."""

    def __init__(self, full: bool) -> None:
        self._modules = _Modules(full)

    @property
    def full(self) -> bool:
        """True when the parts come from the whole ``kubernetes`` package."""
        return self._modules.full

    @property
    def configuration(self) -> type[Configuration]:
        """``kubernetes.client.Configuration``."""
        cls: type[Configuration] = self._modules.get(_CONFIGURATION).Configuration
        return cls

    @property
    def config_exception(self) -> type[Exception]:
        """``kubernetes.config.config_exception.ConfigException``."""
        cls: type[Exception] = self._modules.get(
            "kubernetes.config.config_exception"
        ).ConfigException
        return cls

    def rest_client(self, configuration: Configuration) -> RestClient:
        """``kubernetes.client.rest.RESTClientObject(configuration)``: the urllib3 pool."""
        client: RestClient = self._modules.get("kubernetes.client.rest").RESTClientObject(
            configuration
        )
        return client

    def load_kube_config(self, **kwargs: Any) -> None:
        """``kubernetes.config.load_kube_config(**kwargs)``."""
        self._modules.get("kubernetes.config.kube_config").load_kube_config(**kwargs)

    def load_incluster_config(self, **kwargs: Any) -> None:
        """``kubernetes.config.load_incluster_config(**kwargs)``."""
        self._modules.get("kubernetes.config.incluster_config").load_incluster_config(**kwargs)


_official = Official(full=False)
_full_official = Official(full=True)


def official() -> Official:
    """The official client's connection code, imported as lightly as possible (module
    docstring)."""
    return _official


def full_official() -> Official:
    """The same, from the whole ``kubernetes`` package (imported when first used)."""
    return _full_official


class RestClient(Protocol):
    """The part of ``kubernetes.client.rest.RESTClientObject`` sharegpu uses."""

    @property
    def pool_manager(self) -> urllib3.PoolManager: ...


class KubeClient(Protocol):
    """What :class:`~sharegpu.kube.transport.Transport` needs of a client: an official
    ``ApiClient`` or an :class:`ApiConnection`."""

    @property
    def configuration(self) -> Configuration: ...

    @property
    def default_headers(self) -> Mapping[str, str]: ...

    @property
    def rest_client(self) -> RestClient: ...

    def close(self) -> None:
        """Close every connection of the pool."""
        ...


class ApiConnection:
    """An official ``Configuration`` and the urllib3 pool the official ``RESTClientObject`` builds
    from it (TLS settings, client certificate, proxy, retries, keep-alive), under the attribute
    names of ``ApiClient``; without the generated APIs and models. ``close()`` closes every
    connection."""

    def __init__(self, configuration: Configuration) -> None:
        self.configuration = configuration
        self.default_headers: dict[str, str] = {"User-Agent": USER_AGENT}
        self.rest_client: RestClient = official().rest_client(configuration)

    def close(self) -> None:
        self.rest_client.pool_manager.clear()

    def __enter__(self) -> ApiConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
