"""make setup's Ray: the pinned wheel is RAY_VERSION's, for the venv's CPython, sha256-pinned."""

import re

import pytest
from install_ray import PinMismatch, check_pin, wheel_tags
from pins import load_pins


def test_pinned_ray_wheel_is_the_pinned_release_for_cpython_311():
    pins = load_pins()
    assert re.fullmatch(r"[0-9a-f]{64}", pins["RAY_CPU_WHEEL_SHA256"])
    version, py, platform = check_pin(pins, (3, 11))
    assert (version, py) == (pins["RAY_VERSION"], "3.11")
    assert platform.endswith("x86_64")


def test_another_interpreter_is_refused_naming_the_pin():
    with pytest.raises(PinMismatch, match=r"cp311, this interpreter is cp312: pin the cp312 wheel"):
        check_pin(load_pins(), (3, 12))


def test_a_wheel_of_another_release_is_refused():
    pins = load_pins() | {"RAY_CPU_WHEEL": "ray-9.9.9-cp311-cp311-manylinux2014_x86_64.whl"}
    with pytest.raises(PinMismatch, match="one release"):
        check_pin(pins, (3, 11))


def test_wheel_tags():
    assert wheel_tags("ray-2.56.1-cp311-cp311-manylinux2014_x86_64.whl") == (
        "2.56.1",
        "cp311",
        "manylinux2014_x86_64",
    )
    with pytest.raises(PinMismatch):
        wheel_tags("ray-2.56.1-py3-none-any.whl")
