"""A rented node's id: fresh enough that the minter (which never grants a retired id again) does not refuse it near
its revocation cap, and short enough for every place it goes (a bus subject token, a Kubernetes label and pod name)."""

import re

from shared.buscreds import NAME
from services.placement.catalogue import OFFER_NAME
from services.placement.fleet import rented_node_id
from services.placement.providers.kubernetes import pod_name

LONGEST_OFFER = "a100." + "g" * 43  # OFFER_NAME allows 48 characters


def test_the_longest_offer_name_gives_an_id_that_fits_a_subject_token_a_label_and_a_pod_name():
    assert OFFER_NAME.match(LONGEST_OFFER) and len(LONGEST_OFFER) == 48
    node_id = rented_node_id(LONGEST_OFFER)
    assert NAME.match(node_id) and len(node_id) <= 63  # a Kubernetes label value's limit
    assert pod_name(node_id).endswith(node_id.rsplit("-", 1)[1][:8])  # the pod name keeps most of its random part


def test_ids_carry_at_least_40_random_bits():
    """With 24 bits, about one rental in 330 met a retired id once the minter held its 50,000 revocations."""
    ids = {rented_node_id("p4d.24xlarge") for _ in range(2000)}
    suffixes = {re.fullmatch(r"od-p4d-24xlarge-([0-9a-f]+)", i).group(1) for i in ids}  # type: ignore[union-attr]
    assert len(ids) == 2000 and min(len(s) for s in suffixes) * 4 >= 40
