"""The demo's topology: two cities -> a region -> the centre (docs/topologies.md), as one config.

Each city's `REGISTRATION` stream is copied, ordered and unsampled, into the region's stream of the
same name (fan-in: both cities' hops share one config but the URLs). The region's stream is copied
to the centre sampled, one replication per city's subjects (a partitioned source), so that each city
is a site of its own in the advisories and in fleet health; those replications advise on the region
and one more copies the advisory stream up to the centre, where fleet health reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CITIES = ("ams", "fra")
STREAM = "REGISTRATION"
SUBJECT = "fleet.registration"
ADVISORY_STREAM = "ADVISORIES"
ADVISORY_SUBJECTS = "sr.advisories.>"
CITY_HOP = "registration_region"  # the same name in every city, as docs/topologies.md suggests
ADVISORY_HOP = "advisories_centre"


def tree_config(urls: Mapping[str, str], *, age: float, interval: float) -> dict[str, Any]:
    """`urls`: each city's, `region` and `centre`. `age`: the sampling age at the region; a node is
    announced timed out after two registration intervals without a message."""
    topics: dict[str, Any] = {}
    for city in CITIES:
        topics[f"{city}_region"] = {
            "topic": f"{SUBJECT}.>", "source_url": urls[city], "target_url": urls["region"],
            "source_stream": STREAM, "name": CITY_HOP,
        }
    for city in CITIES:
        topics[city] = {
            "topic": f"{SUBJECT}.{city}.>", "source_url": urls["region"], "target_url": urls["centre"],
            "source_stream": STREAM, "name": city, "inspect": "sender", "update_flag": "updated",
            "age": f"{age}s",
            "advisory": {"target": f"sr.advisories.{city}", "cluster": "source", "age": f"{interval * 2}s"},
        }
    topics[ADVISORY_HOP] = {
        "topic": ADVISORY_SUBJECTS, "source_url": urls["region"], "target_url": urls["centre"],
        "source_stream": ADVISORY_STREAM, "name": ADVISORY_HOP,
    }
    return {"topics": topics}
