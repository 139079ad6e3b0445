"""Chapter 08's node groups: the bytes a node's link carries for the groups across are the ring's payload plus the
packets' headers and ACKs (more of them under load), never less than the payload, never a wrong algorithm's."""

import pytest

from distrinews_course import node_groups


def rows(across_mib):
    out = []
    for rank, mib in enumerate(across_mib):
        node, local = divmod(rank, 2)
        mine, across = [2 * node, 2 * node + 1], [local, local + 2]
        out.append(
            {
                "rank": rank,
                "node": node,
                "local": local,
                "within": {"ranks": mine, "sum": float(sum(mine)), "link_mib": 0.001},
                "across": {"ranks": across, "sum": float(sum(across)), "link_mib": mib},
            }
        )
    return out


def carried(across_mib):
    return node_groups.claims(rows(across_mib))[3]


@pytest.mark.parametrize("mib", [8.02, 8.15, 8.96])  # a quiet box; CI's load (a run that once failed at 5%)
def test_the_payload_with_its_headers_passes(mib):
    c = carried([8.02, 8.02, mib, 8.02])
    assert c.holds and "headers and ACKs" in c.text


@pytest.mark.parametrize(
    "mib",
    [
        7.5,  # less than the ring's payload: a rank sent only part of its message
        12.0,  # half as much again as the ring needs
        16.0,  # twice the ring's bytes
    ],
)
def test_a_wrong_byte_count_fails(mib):
    assert not carried([8.02, 8.02, mib, 8.02]).holds
