"""Which address this machine advertises: the route toward the peers, an interface, or
an explicit one; never loopback toward remote hosts. Checked on real test hosts too."""

from __future__ import annotations

import json
import sys

import pytest

from rendezvous.net import addresses
from rendezvous.net.addresses import AddressError


def test_one_machine_jobs_use_loopback():
    assert addresses.advertised_address([]) == "127.0.0.1"
    assert addresses.advertised_address(["localhost", "127.0.0.1"]) == "127.0.0.1"


def test_bad_inputs_name_what_is_wrong():
    with pytest.raises(AddressError, match="nope0"):
        addresses.interface_address("nope0")
    with pytest.raises(AddressError, match="does not resolve"):
        addresses.resolve("no-such-host.invalid")
    with pytest.raises(AddressError, match=r"loopback.*10\.1\.2\.3"):
        addresses.advertised_address(["10.1.2.3"], explicit="127.0.0.1")
    with pytest.raises(AddressError, match=r"loopback.*10\.1\.2\.3"):
        addresses.advertised_address(["10.1.2.3"], interface="lo")
    assert addresses.interface_address("lo") == "127.0.0.1"


def test_the_route_toward_test_hosts(three_hosts):
    """From here the hosts are reached through the bridge address; from a host, the
    route toward this machine leaves from the host's own address."""
    host_addresses = [h.address for h in three_hosts]
    assert addresses.advertised_address(host_addresses) == three_hosts.gateway
    host = three_hosts[1]
    code = (
        "import json,sys; from rendezvous.net import addresses; "
        f"print(json.dumps([addresses.address_toward({three_hosts.gateway!r}), "
        f"addresses.advertised_address([{three_hosts[2].address!r}])]))"
    )
    out = host.run([sys.executable, "-c", code])
    assert json.loads(out.stdout) == [host.address, host.address], out.stderr
