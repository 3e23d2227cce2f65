"""The controller's settings: one typed, validated field per flag, built from the flags in one
place."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from api.names import CONTROLLER_LEASE_NAME, DEFAULT_DRIVER_NAME
from controller.config import (
    API_AUTH_NONE,
    ConfigError,
    ControllerConfig,
    build_parser,
    config_from_args,
    parse_config,
)

TLS = ["--tls-cert-file=/tls/tls.crt", "--tls-key-file=/tls/tls.key"]


def test_every_flag_is_one_field() -> None:
    """Each flag's ``dest`` is a field of the settings and each field a flag's, so a new flag
    cannot be left out of them."""
    fields = {f.name for f in dataclasses.fields(ControllerConfig)}
    dests = {
        action.dest
        for action in build_parser()._actions
        if not isinstance(action, argparse._HelpAction | argparse._VersionAction)
    }
    assert dests == fields


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRIVER_NAME", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    config = parse_config(TLS)
    assert config.driver_name == DEFAULT_DRIVER_NAME
    assert (config.webhook_address, config.metrics_address, config.api_address) == (
        "127.0.0.1:8443",
        "127.0.0.1:9401",
        "127.0.0.1:8080",
    )
    assert (config.lease_namespace, config.lease_name) == ("default", CONTROLLER_LEASE_NAME)
    assert config.webhook and config.tracker and not config.leader_elect
    assert config.device_classes == () and config.webhook_client_names == ()


def test_flags_become_typed_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRIVER_NAME", "gpu.example.com")
    config = parse_config(
        [
            "--disable-webhook",
            "--disable-tracker",
            "--device-class=a",
            "--device-class=b",
            "--webhook-client-name=kube-apiserver",
            "--leader-elect",
            f"--api-auth={API_AUTH_NONE}",
            "--probe-address=127.0.0.1:0",
        ]
    )
    assert config.driver_name == "gpu.example.com"
    assert config.device_classes == ("a", "b")
    assert config.webhook_client_names == ("kube-apiserver",)
    assert config.leader_elect is True and config.api_auth == API_AUTH_NONE
    assert not config.webhook and not config.tracker
    assert config.probe_address == "127.0.0.1:0"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.driver_name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the webhook needs --tls-cert-file and --tls-key-file (or --disable-webhook)"),
        (["--tls-cert-file=/tls/tls.crt"], "the webhook needs --tls-cert-file and --tls-key-file"),
        ([*TLS, "--api-tls-cert-file=/a.crt"], "--api-tls-cert-file and --api-tls-key-file go"),
        (["--disable-webhook", "--api-tls-key-file=/a.key"], "--api-tls-cert-file and --api-"),
    ],
)
def test_flags_that_do_not_go_together(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_args(build_parser().parse_args(argv))
    assert str(err.value).startswith(message)
