"""Placement addresses read back from the store are parsed strictly."""

from __future__ import annotations

import pytest

from durable_spaces.cluster.address import LocalAddress, SpacesdAddress, parse_address
from durable_spaces.errors import ConfigError


def test_addresses_round_trip() -> None:
    a = SpacesdAddress("10.77.0.2:4000", "/srv/ds/spaces/x/work", "ab12", "10.77.0.2:7000")
    assert parse_address(a.format()) == a
    assert a.url == "http://10.77.0.2:4000"
    c = SpacesdAddress("10.77.0.1:4001", "/workspace", "ab12", "10.77.0.1:7000", "cua")
    assert parse_address(c.format()) == c
    b = LocalAddress("/srv/ds/spaces", "dsc-x-1", "3f2c-9a")
    assert parse_address(b.format()) == b


@pytest.mark.parametrize(
    "bad",
    [
        "ftp://10.0.0.1:1/?root=/w&instance=a&host=10.0.0.1:2",
        "http://10.0.0.1:1/?root=w&instance=a&host=10.0.0.1:2",  # relative root
        "http://10.0.0.1:1/?root=/w/../etc&instance=a&host=10.0.0.1:2",
        "http://10.0.0.1:1/?root=/w&instance=a;rm&host=10.0.0.1:2",
        "http://10.0.0.1:1/?root=/w&instance=a&host=nowhere",
        "http://evil.example:1/?root=/w&instance=a&host=10.0.0.1:2",
        "http://10.0.0.1:1/?root=/w&root=/v&instance=a&host=10.0.0.1:2",
        "http://10.0.0.1:1/?root=/w&instance=a&host=10.0.0.1:2&user=root;x",
        "local:///srv?name=../x&instance=a",
        "local:///srv?instance=a",
    ],
)
def test_a_bad_address_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_address(bad)
