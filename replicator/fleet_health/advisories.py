"""Advisory messages (the `https://choria.io/schemas/sr/v1/age_advisory.json` contract) as typed
DataFrame rows.

Validation stays in Spark SQL (no Python UDF) so that parsing scales like the read. Malformed
messages are kept, flagged, so they can be counted; string fields take any JSON scalar as its
text, as Spark's JSON reader does.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

ADVISORY_SCHEMA_ID = "https://choria.io/schemas/sr/v1/age_advisory.json"
# Also valid: what the previous release wrote, still in advisory streams after an upgrade.
ADVISORY_SCHEMA_IDS = (ADVISORY_SCHEMA_ID, "stream-replicator/v1/age_advisory")
EVENTS = ("new", "timeout", "recover", "expire")
# The replicator's other advisories on the same subject: not a node's, so not folded, yet not malformed.
# A blind spot (the replicator was not watching from `from` to `until`) makes the silences inside it unknown.
OTHER_SCHEMA_IDS = {
    "gap": "https://stream-replicator.io/schemas/sr/v1/gap_advisory.json",
    "blind_spot": "https://stream-replicator.io/schemas/sr/v1/blind_spot_advisory.json",
}
OTHER_FIELDS = StructType([StructField("$schema", StringType()), StructField("event", StringType()),
                           StructField("replicator", StringType()), StructField("topic", StringType()),
                           StructField("from", DoubleType()), StructField("until", DoubleType())])

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
    """`sequence`, `data` (JSON bytes) -> `sequence`, `valid` and the advisory fields (null if
    unparsable), `other` (a `gap` or `blind_spot` advisory) and a blind spot's `spot_from`, `spot_until`."""
    text = F.col("data").cast("string")
    parsed = raw.select(
        F.col("sequence"),
        F.from_json(text, ADVISORY_FIELDS).alias("a"),
        F.from_json(text, OTHER_FIELDS).alias("o"),
    )
    o = F.col("o")
    other = F.lit(False)
    for event, schema_id in OTHER_SCHEMA_IDS.items():
        other = other | ((o["$schema"] == schema_id) & (o["event"] == event))
    spot = F.coalesce(other & (o["event"] == "blind_spot") & o["from"].isNotNull() & o["until"].isNotNull()
                      & o["replicator"].isNotNull(), F.lit(False))
    return parsed.select(
        "sequence",
        _is_valid(F.col("a")).alias("valid"),
        *[F.col("a")[name].alias(name) for name in EVENT_COLUMNS[1:]],
        F.coalesce(other, F.lit(False)).alias("other"),
        F.when(spot, o["from"]).alias("spot_from"),
        F.when(spot, o["until"]).alias("spot_until"),
    )


def valid_events(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("valid")).select(*EVENT_COLUMNS)


def blind_spots(parsed: DataFrame) -> DataFrame:
    """`replicator`, `from`, `until` (unix s) of the blind spot advisories in `parsed`."""
    return parsed.where(F.col("spot_from").isNotNull()).select(
        F.coalesce(F.col("replicator"), F.lit("")).alias("replicator"),
        F.col("spot_from").alias("from"), F.col("spot_until").alias("until"))
