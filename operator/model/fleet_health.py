"""`spec.fleetHealth`: the Spark job that aggregates a replication's advisories into fleet-health tables,
as typed models (build/spark_application.py turns them into a ScheduledSparkApplication)."""

from __future__ import annotations

from typing import Annotated

from pydantic import WithJsonSchema
from replication_operator.model.fields import (
    DNS_SUBDOMAIN,
    JETSTREAM_NAME,
    NATS_URLS,
    SPARK_MEMORY,
    Model,
    field,
    key_field,
    name_field,
)
from replication_operator.model.template import SparkTemplate

SCHEDULE = r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|@every ([0-9]+(ms|s|m|h))+|\S+(\s+\S+){4})$"
MavenPackage = Annotated[str, WithJsonSchema({
    "type": "string", "maxLength": 256, "pattern": r"^[A-Za-z0-9_.-]+:[A-Za-z0-9_.-]+:[A-Za-z0-9_.+-]+$"})]


class S3CredentialsSecret(Model):
    name: str = name_field("Name of the Secret, in the StreamReplication's namespace.")
    access_key_id_key: str = key_field("Key of the access key id in the Secret.", "AWS_ACCESS_KEY_ID")
    secret_access_key_key: str = key_field("Key of the secret access key in the Secret.", "AWS_SECRET_ACCESS_KEY")
    session_token_key: str | None = key_field("Key of a session token (temporary credentials); none by default.",
                                              None)


class S3(Model):
    credentials_secret: S3CredentialsSecret | None = field(
        "Secret with the access key pair, given to the driver and executors as AWS_* env vars.", None)


class Driver(Model):
    cores: int | None = field("CPU cores of the driver; default 1.", None, minimum=1, maximum=64)
    memory: str | None = field("Spark memory, e.g. `512m`, `2g`; default `1g`.", None,
                               maxLength=16, pattern=SPARK_MEMORY)


class Executor(Model):
    instances: int | None = field("Executors; default 2. The advisory stream is read in one slice per core.",
                                  None, minimum=1, maximum=1000)
    cores: int | None = field("CPU cores of each executor; default 1.", None, minimum=1, maximum=64)
    memory: str | None = field("Spark memory, e.g. `512m`, `2g`; default `1g`.", None,
                               maxLength=16, pattern=SPARK_MEMORY)


CONNECTOR_RULES = [
    {"rule": "!self.output.startsWith('gs://') || (has(self.packages) && "
             "self.packages.exists(p, p.contains(':gcs-connector:')))",
     "message": "fleetHealth.output gs:// needs the GCS connector: declare it in fleetHealth.packages "
                "(com.google.cloud.bigdataoss:gcs-connector:<version>)"},
    {"rule": "!(self.output.startsWith('abfs://') || self.output.startsWith('abfss://')) || (has(self.packages) && "
             "self.packages.exists(p, p.contains(':hadoop-azure:')))",
     "message": "fleetHealth.output abfs:// needs the Azure connector: declare it in fleetHealth.packages "
                "(org.apache.hadoop:hadoop-azure:<Hadoop version of the Spark image>)"},
    {"rule": "!has(self.s3) || self.output.startsWith('s3a://')", "message": "fleetHealth.s3 is for an s3a:// output"},
]


class FleetHealth(Model):
    model_config = {"json_schema_extra": {"x-kubernetes-validations": CONNECTOR_RULES}}

    output: str = field("Where the fleet-health tables are written (a path or URI the Spark image can write).",
                        maxLength=1024, minLength=1)
    schedule: str | None = field(
        "Cron schedule (`*/15 * * * *`) or `@every 15m`; default `@every 1h`.", None, maxLength=128, pattern=SCHEDULE)
    time_zone: str | None = field("Time zone of the cron schedule, e.g. `Europe/Berlin`.", None, maxLength=64)
    suspend: bool = field("Stop scheduling runs (a running one finishes).", False)
    stream: str | None = field(
        "JetStream stream holding the advisories; default the stream that stores spec.advisory.subject.", None,
        maxLength=255, pattern=JETSTREAM_NAME)
    url: str | None = field("NATS URL of the advisory cluster; default the advisory cluster's URL.", None,
                            maxLength=2048, pattern=NATS_URLS)
    kv_bucket: str = field(
        "KV bucket the job writes its summary to (key `summary`); the operator reads it into status.fleet.",
        "FLEET_HEALTH", maxLength=64, pattern=r"^[-A-Za-z0-9_]+$")
    packages: list[MavenPackage] | None = field(
        "Extra Maven packages (groupId:artifactId:version) on the driver and executor classpaths, e.g. the "
        "connector of the output's file system; hadoop-aws is added for s3a:// by itself.", None, maxItems=32)
    s3: S3 | None = field(
        "S3 credentials of an s3a:// output. Without credentialsSecret the pods' own identity is used (IRSA / "
        "instance profile: the AWS SDK's default chain).", None)
    image: str | None = field(
        "Spark image with stream-replicator installed; default the operator's own (its "
        "STREAM_REPLICATOR_SPARK_IMAGE, the chart's `sparkImage`).", None, maxLength=512, minLength=1)
    spark_version: str | None = field("Spark version of the image, for the Spark operator; default 4.0.0.", None,
                                      maxLength=32, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    driver: Driver | None = field("The Spark driver's pod.", None)
    executor: Executor | None = field("The Spark executors' pods.", None)
    service_account: str | None = field(
        "Service account of the Spark driver (it starts the executors); default spark-operator-spark.", None,
        maxLength=253, pattern=DNS_SUBDOMAIN)
    spark_conf: dict[str, str] | None = field("Extra Spark settings, e.g. for the output's file system.", None)
    hadoop_conf: dict[str, str] | None = field("Extra Hadoop settings, e.g. `fs.s3a.endpoint`.", None)
    template: SparkTemplate | None = field(
        "Shapes the Spark driver and executor pods (image pull Secrets, priority, spreading, labels, env, "
        "securityContext), as spec.template does the workers'.", None)
