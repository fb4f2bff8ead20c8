"""Advisory messages (the `https://choria.io/schemas/sr/v1/age_advisory.json` contract) as typed
DataFrame rows.

Validation stays in Spark SQL (no Python UDF) so that parsing scales like the read. Malformed
messages are kept, flagged, so they can be counted; string fields take any JSON scalar as its
text, as Spark's JSON reader does.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

ADVISORY_SCHEMA_ID = "https://choria.io/schemas/sr/v1/age_advisory.json"
# Also valid: what the previous release wrote, still in advisory streams after an upgrade.
ADVISORY_SCHEMA_IDS = (ADVISORY_SCHEMA_ID, "stream-replicator/v1/age_advisory")
EVENTS = ("new", "timeout", "recover", "expire")

ADVISORY_FIELDS = StructType(
    [
        StructField("$schema", StringType()),
        StructField("event_id", StringType()),
        StructField("event", StringType()),
        StructField("inspect", StringType()),
        StructField("value", StringType()),
        StructField("age", LongType()),
        StructField("seen", LongType()),
        StructField("replicator", StringType()),
        StructField("topic", StringType()),
        StructField("timestamp", LongType()),
    ]
)

# A valid advisory as the job keeps it (the `events` table): everything but the constant `$schema`.
EVENT_SCHEMA = StructType(
    [StructField("sequence", LongType(), False), *(f for f in ADVISORY_FIELDS.fields if f.name != "$schema")]
)
EVENT_COLUMNS = tuple(EVENT_SCHEMA.fieldNames())


def _is_valid(a: Column) -> Column:
    required = [a[f.name].isNotNull() for f in ADVISORY_FIELDS.fields]
    non_empty = [F.length(a[name]) > 0 for name in ("event_id", "value", "replicator")]
    checks = [
        a.isNotNull(),
        *required,
        *non_empty,
        a["$schema"].isin(*ADVISORY_SCHEMA_IDS),
        a["event"].isin(*EVENTS),
    ]
    valid = checks[0]
    for check in checks[1:]:
        valid = valid & check
    return F.coalesce(valid, F.lit(False))


def parse_advisories(raw: DataFrame) -> DataFrame:
    """`sequence`, `data` (JSON bytes) -> `sequence`, `valid` and the advisory fields (null if unparsable)."""
    parsed = raw.select(
        F.col("sequence"),
        F.from_json(F.col("data").cast("string"), ADVISORY_FIELDS).alias("a"),
    )
    return parsed.select(
        "sequence",
        _is_valid(F.col("a")).alias("valid"),
        *[F.col("a")[name].alias(name) for name in EVENT_COLUMNS[1:]],
    )


def valid_events(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("valid")).select(*EVENT_COLUMNS)
