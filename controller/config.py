"""The controller's settings: every command-line flag, parsed and checked in one place.

:func:`build_parser` defines the flags (``DRIVER_NAME`` and ``POD_NAMESPACE`` give defaults);
:func:`config_from_args` turns them into one immutable :class:`ControllerConfig`, raising
:class:`ConfigError` for combinations the parser cannot refuse. Each flag is one field, named
as the flag's ``dest`` (a repeatable flag's is a tuple); adding a flag is a parser entry, a field
and a line of :func:`config_from_args`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from api.names import CONTROLLER_LEASE_NAME, DEFAULT_DRIVER_NAME
from api.version import VERSION
from controller.apiauth import DEFAULT_AUDIENCE
from controller.idle import (
    DEFAULT_PERIOD_S,
    DEFAULT_THRESHOLD_PERCENT,
    MAX_PERIOD_S,
    MAX_THRESHOLD_PERCENT,
    MIN_PERIOD_S,
    IdlePolicy,
)
from sharegpu.kube.logs import LOG_FORMATS, LOG_LEVELS
from sharegpu.kube.telemetry import parse_address

API_AUTH_KUBERNETES: Final = "kubernetes"
API_AUTH_NONE: Final = "none"
API_AUTH_MODES: Final = (API_AUTH_KUBERNETES, API_AUTH_NONE)


class ConfigError(ValueError):
    """Flags that do not go together; the message is one line naming them."""


@dataclass(frozen=True)
class ControllerConfig:
    """All settings of ``sharegpu-controller`` (immutable, validated). An empty address or
    file name means off or none, as on the command line."""

    kubeconfig: str | None
    driver_name: str
    webhook_address: str
    tls_cert_file: str
    tls_key_file: str
    webhook_client_ca_file: str
    #: Names the API server's webhook client certificate must carry (none: any the CA signed).
    webhook_client_names: tuple[str, ...]
    #: DeviceClasses of the driver whose requests are checked, beside those named like it.
    device_classes: tuple[str, ...]
    metrics_address: str
    api_address: str
    api_auth: str
    api_token_audience: str
    api_tls_cert_file: str
    api_tls_key_file: str
    probe_address: str
    leader_elect: bool
    lease_namespace: str
    lease_name: str
    log_format: str
    log_level: str
    #: Percent of a share's reservation under which it counts as idle (0: idle reporting off).
    idle_threshold_percent: int
    idle_period_seconds: int
    disable_webhook: bool
    disable_tracker: bool

    @property
    def webhook(self) -> bool:
        """Whether the admission webhook is served."""
        return not self.disable_webhook

    @property
    def tracker(self) -> bool:
        """Whether the GPUs are tracked (and the API server is reached)."""
        return not self.disable_tracker

    @property
    def idle_policy(self) -> IdlePolicy | None:
        """The idle policy the flags configure (None: idle reporting off)."""
        if self.idle_threshold_percent == 0:
            return None
        return IdlePolicy(self.idle_threshold_percent, self.idle_period_seconds)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false (got {text!r})")


def _address(text: str) -> str:
    if text:
        try:
            parse_address(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _bounded_int(flag: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``, else an error naming ``flag``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} must be an integer from {low} to {high}, not {text!r}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be from {low} to {high}, not {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the controller."""
    p = argparse.ArgumentParser(
        prog="sharegpu-controller",
        description="sharegpu controller: admission webhook, per-GPU allocation tracking "
        "(GPU objects), JSON API and Prometheus metrics.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    env = os.environ.get
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (else $KUBECONFIG, else the in-cluster configuration)",
    )
    p.add_argument(
        "--driver-name",
        default=env("DRIVER_NAME", DEFAULT_DRIVER_NAME),
        help="DRA driver name (env DRIVER_NAME; default %(default)s)",
    )
    p.add_argument(
        "--webhook-address",
        type=_address,
        default="127.0.0.1:8443",
        help="HTTPS address of the admission webhook; the API server must reach it, e.g. "
        "$(POD_IP):8443 (default %(default)s)",
    )
    p.add_argument(
        "--tls-cert-file",
        default="",
        help="webhook serving certificate (PEM); reloaded when it changes",
    )
    p.add_argument("--tls-key-file", default="", help="webhook private key (PEM)")
    p.add_argument(
        "--webhook-client-ca-file",
        default="",
        help="CA bundle (PEM) that signs the API server's webhook client certificate; reviews "
        "whose client certificate it verifies may charge GpuQuotas, every other review is "
        "judged without charging (empty: no review charges; see docs/security.md)",
    )
    p.add_argument(
        "--webhook-client-name",
        dest="webhook_client_names",
        action="append",
        default=[],
        metavar="NAME",
        help="a name (subject CN or DNS SAN) the API server's client certificate must carry "
        "(repeatable; none: any certificate the client CA signed)",
    )
    p.add_argument(
        "--device-class",
        dest="device_classes",
        action="append",
        default=[],
        metavar="NAME",
        help="DeviceClass of this driver whose requests are checked (repeatable; "
        "classes named like the driver always are)",
    )
    p.add_argument(
        "--metrics-address",
        type=_address,
        default="127.0.0.1:9401",
        help="address of /metrics (empty: off; default %(default)s)",
    )
    p.add_argument(
        "--api-address",
        type=_address,
        default="127.0.0.1:8080",
        help="address of the JSON API and /healthz, /readyz (empty: off; default %(default)s)",
    )
    p.add_argument(
        "--api-auth",
        choices=API_AUTH_MODES,
        default=API_AUTH_KUBERNETES,
        help="who may read the JSON API: kubernetes (a bearer token whose user may list GPU "
        "objects, checked with TokenReview and SubjectAccessReview) or none (anyone who can "
        "connect; for an API bound to 127.0.0.1); the probes never need credentials "
        "(default %(default)s)",
    )
    p.add_argument(
        "--api-token-audience",
        default=DEFAULT_AUDIENCE,
        help="the audience the JSON API's bearer tokens must be bound to (kubectl create token "
        "SA --audience ...; default %(default)s)",
    )
    p.add_argument(
        "--api-tls-cert-file",
        default="",
        help="serve the JSON API over HTTPS with this certificate (PEM; reloaded when it "
        "changes); empty: plain HTTP, for an API bound to 127.0.0.1",
    )
    p.add_argument("--api-tls-key-file", default="", help="private key of --api-tls-cert-file")
    p.add_argument(
        "--probe-address",
        type=_address,
        default="",
        help="address of a plain-HTTP port serving only /healthz and /readyz, off the JSON "
        "API's authenticated path (empty: off; the probes are also on the API port)",
    )
    p.add_argument(
        "--leader-elect",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="elect one writing replica with a Lease (default %(default)s)",
    )
    p.add_argument(
        "--lease-namespace",
        default=env("POD_NAMESPACE", "default"),
        help="namespace of the Lease (env POD_NAMESPACE; default %(default)s)",
    )
    p.add_argument(
        "--lease-name",
        default=CONTROLLER_LEASE_NAME,
        help="name of the Lease (default %(default)s)",
    )
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.add_argument(
        "--idle-threshold-percent",
        type=_bounded_int("--idle-threshold-percent", 0, MAX_THRESHOLD_PERCENT),
        default=DEFAULT_THRESHOLD_PERCENT,
        help="a share is idle when its measured SM utilisation and memory stay under this "
        "percent of what it reserved for --idle-period-seconds (0: idle reporting off; "
        "default %(default)s)",
    )
    p.add_argument(
        "--idle-period-seconds",
        type=_bounded_int("--idle-period-seconds", MIN_PERIOD_S, MAX_PERIOD_S),
        default=DEFAULT_PERIOD_S,
        help="how long a share must stay under --idle-threshold-percent to be reported idle "
        "(default %(default)s)",
    )
    p.add_argument("--disable-webhook", action="store_true", help="do not serve the webhook")
    p.add_argument(
        "--disable-tracker",
        action="store_true",
        help="do not track GPUs (no API access needed then)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> ControllerConfig:
    """The settings of parsed flags; raise :class:`ConfigError` for flags that do not go
    together."""
    if not args.disable_webhook and not (args.tls_cert_file and args.tls_key_file):
        raise ConfigError(
            "the webhook needs --tls-cert-file and --tls-key-file (or --disable-webhook)"
        )
    if bool(args.api_tls_cert_file) != bool(args.api_tls_key_file):
        raise ConfigError("--api-tls-cert-file and --api-tls-key-file go together")
    return ControllerConfig(
        kubeconfig=args.kubeconfig,
        driver_name=args.driver_name,
        webhook_address=args.webhook_address,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        webhook_client_ca_file=args.webhook_client_ca_file,
        webhook_client_names=tuple(args.webhook_client_names),
        device_classes=tuple(args.device_classes),
        metrics_address=args.metrics_address,
        api_address=args.api_address,
        api_auth=args.api_auth,
        api_token_audience=args.api_token_audience,
        api_tls_cert_file=args.api_tls_cert_file,
        api_tls_key_file=args.api_tls_key_file,
        probe_address=args.probe_address,
        leader_elect=args.leader_elect,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        log_format=args.log_format,
        log_level=args.log_level,
        idle_threshold_percent=args.idle_threshold_percent,
        idle_period_seconds=args.idle_period_seconds,
        disable_webhook=args.disable_webhook,
        disable_tracker=args.disable_tracker,
    )


def parse_config(argv: Sequence[str] | None = None) -> ControllerConfig:
    """Parse flags (argparse exits with status 2 on unknown flags or bad values)."""
    return config_from_args(build_parser().parse_args(argv))
