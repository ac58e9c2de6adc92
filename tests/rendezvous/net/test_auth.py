"""The proof of the job secret a call carries (``rendezvous.net.auth``): what it binds,
checked by ``CallVerifier`` alone (no server, no socket)."""

from __future__ import annotations

import pytest

from rendezvous.net import auth

pytestmark = pytest.mark.unit

SECRET = auth.make_secret()
METHOD = "/elastic.ps.Shard/Push"
BODY = b"the body"


def _token(metadata) -> str:
    return dict(metadata)[auth.RPC_METADATA_KEY]


def test_a_proof_is_for_one_incarnation_of_the_server():
    """A proof made for the server's incarnation passes (head and body); the same call
    made for another incarnation (the process before a restart) is refused as such,
    and the refusal says so."""
    here, before = auth.new_incarnation(), auth.new_incarnation()
    verifier = auth.CallVerifier(SECRET, here)
    good = auth.call_metadata(SECRET, METHOD, BODY, here)
    nonce = verifier.check_head(METHOD, _token(good))
    verifier.check_body(nonce, BODY, dict(good)[auth.RPC_BODY_KEY])

    old = auth.call_metadata(SECRET, METHOD, BODY, before)
    with pytest.raises(auth.OtherIncarnation, match="another incarnation") as info:
        verifier.check_head(METHOD, _token(old))
    assert before in str(info.value) and here in str(info.value)
    # and again as such: its nonce was never taken
    with pytest.raises(auth.OtherIncarnation):
        verifier.check_head(METHOD, _token(old))


def test_the_incarnation_a_proof_names_is_covered_by_its_mac():
    """An attacker who rewrites the incarnation of a captured proof to the server's has
    no proof left; a wrong secret reads as such, whatever incarnation it names."""
    here, before = auth.new_incarnation(), auth.new_incarnation()
    verifier = auth.CallVerifier(SECRET, here)
    stamp, nonce, named, mac = _token(auth.call_metadata(SECRET, METHOD, BODY, before)).split(".")
    assert named == before
    with pytest.raises(auth.ProofRefused, match="wrong job secret") as info:
        verifier.check_head(METHOD, f"{stamp}.{nonce}.{here}.{mac}")
    assert not isinstance(info.value, auth.OtherIncarnation)
    stranger = auth.call_metadata(auth.make_secret(), METHOD, BODY, before)
    with pytest.raises(auth.ProofRefused, match="wrong job secret") as info:
        verifier.check_head(METHOD, _token(stranger))
    assert not isinstance(info.value, auth.OtherIncarnation)


def test_a_proof_without_an_incarnation_is_malformed():
    """The format before incarnations (stamp.nonce.mac), or one naming no incarnation,
    is refused as malformed; neither end makes or checks proofs for a malformed one."""
    here = auth.new_incarnation()
    verifier = auth.CallVerifier(SECRET, here)
    stamp, nonce, _named, mac = _token(auth.call_metadata(SECRET, METHOD, BODY, here)).split(".")
    for token in (f"{stamp}.{nonce}.{mac}", f"{stamp}.{nonce}..{mac}", f"{stamp}.{nonce}.X.{mac}"):
        with pytest.raises(auth.ProofRefused, match="malformed"):
            verifier.check_head(METHOD, token)
    for wrong in ("", "0" * 15, "G" * 16, "ABCDEF0123456789"):
        assert not auth.is_incarnation(wrong)
        with pytest.raises(ValueError):
            auth.call_metadata(SECRET, METHOD, BODY, wrong)
        with pytest.raises(ValueError):
            auth.CallVerifier(SECRET, wrong)
    assert auth.is_incarnation(here) and auth.new_incarnation() != here
