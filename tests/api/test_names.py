"""Name rules shared by the node plugin and the controller."""

from __future__ import annotations

from api import names
from api.gpuconfig import config_applies

DRIVER = "gpu.example.com"


def test_driver_value_takes_the_plain_name_first_then_the_qualified_one() -> None:
    assert names.driver_value({"cores": "30"}, DRIVER, "cores") == "30"
    assert names.driver_value({f"{DRIVER}/cores": "20"}, DRIVER, "cores") == "20"
    both = {f"{DRIVER}/cores": "20", "cores": "30"}
    assert names.driver_value(both, DRIVER, "cores") == "30"
    assert names.driver_value({"other.io/cores": "10"}, DRIVER, "cores") is None
    assert names.driver_value({}, DRIVER, "memory") is None


def test_a_subrequest_names_its_request() -> None:
    assert names.base_request_name("gpu/large") == "gpu"
    assert names.base_request_name("gpu") == "gpu"
    assert names.base_request_name("gpu/a/b") == "gpu"
    assert config_applies((), "gpu/large")
    assert config_applies(("gpu",), "gpu/large")
    assert config_applies(("gpu/large",), "gpu/large")
    assert not config_applies(("gpu/small",), "gpu/large")
    assert not config_applies(("other",), "gpu")
