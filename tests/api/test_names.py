"""Name rules shared by the node plugin and the controller."""

from __future__ import annotations

from api import names

DRIVER = "gpu.example.com"


def test_driver_value_takes_the_plain_name_first_then_the_qualified_one() -> None:
    assert names.driver_value({"cores": "30"}, DRIVER, "cores") == "30"
    assert names.driver_value({f"{DRIVER}/cores": "20"}, DRIVER, "cores") == "20"
    both = {f"{DRIVER}/cores": "20", "cores": "30"}
    assert names.driver_value(both, DRIVER, "cores") == "30"
    assert names.driver_value({"other.io/cores": "10"}, DRIVER, "cores") is None
    assert names.driver_value({}, DRIVER, "memory") is None
