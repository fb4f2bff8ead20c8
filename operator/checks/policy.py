"""The administrator's policy: what the author of a StreamReplication may choose.

The operator holds rights its users may lack: it creates Deployments and Spark applications under
the service account, with the image and the Secrets a spec names, and it connects to NATS from its
own pod. Without a policy, `create` on a StreamReplication would lend all of that to its author (a
confused deputy). Pure functions: a spec (and the labels of the Secrets it names, read by the
caller) and the policy in, the list of violations out; the reconciler refuses a resource with any
before it builds anything. docs/threat-model.md explains each rule.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from replication_operator.checks import pod_policy
from replication_operator.model import naming
from replication_operator.model.spec import Endpoint, ReplicationSpec

# Degraded reasons, one per rule (docs/operator.md lists them with the others).
IMAGE_NOT_ALLOWED = "ImageNotAllowed"
SERVICE_ACCOUNT_NOT_ALLOWED = "ServiceAccountNotAllowed"
SECRET_NOT_ALLOWED = "SecretNotAllowed"
HOST_NOT_ALLOWED = "HostNotAllowed"
SPARK_CONF_NOT_ALLOWED = "SparkConfNotAllowed"
SPARK_PACKAGE_NOT_ALLOWED = "SparkPackageNotAllowed"
POD_SECURITY_NOT_ALLOWED = pod_policy.POD_SECURITY_NOT_ALLOWED
PRIORITY_CLASS_NOT_ALLOWED = pod_policy.PRIORITY_CLASS_NOT_ALLOWED
REASONS = frozenset(
    {IMAGE_NOT_ALLOWED, SERVICE_ACCOUNT_NOT_ALLOWED, SECRET_NOT_ALLOWED, HOST_NOT_ALLOWED, SPARK_CONF_NOT_ALLOWED,
     SPARK_PACKAGE_NOT_ALLOWED, POD_SECURITY_NOT_ALLOWED, PRIORITY_CLASS_NOT_ALLOWED}
)

# A Secret's owner opts it in; nobody else's say-so lets a resource mount or read it.
USABLE_LABEL = f"{naming.GROUP}/usable"
USABLE_VALUE = "true"

ANY_HOST = ("*",)
# Spark settings for the output's file system; `spark.kubernetes.*`, Java options, jars and the
# like would let an author change the pods' image, service account, Secrets or code.
DEFAULT_SPARK_CONF = ("spark.hadoop.*",)
# Maven packages spark-submit loads into the driver and executors (`spec.fleetHealth.packages`): code
# running with the Spark pods' rights, so by default only the object-store connectors the operator
# itself names (docs/fleet-health.md#object-storage).
DEFAULT_SPARK_PACKAGES = (
    "org.apache.hadoop:hadoop-aws:*",
    "org.apache.hadoop:hadoop-azure:*",
    "com.google.cloud.bigdataoss:gcs-connector:*",
)


@dataclass(frozen=True)
class Violation:
    """One refused choice: `reason` names the rule, `message` the field, the value and the setting."""

    reason: str
    message: str


@dataclass(frozen=True)
class Policy:
    """Allowed choices, as glob patterns (`fnmatch`: `*` also matches `/`, `.` and `:`).

    `own_*` are the operator's own defaults (its configured images; the Spark operator's account for
    Spark drivers): what the operator uses when a spec names nothing, so naming them is allowed too.
    """

    own_images: tuple[str, ...] = ()
    own_service_accounts: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()  # a name, or `<namespace>/<name>` when it has a `/`
    unlabelled_secrets_namespaces: tuple[str, ...] = ()
    nats_hosts: tuple[str, ...] = ANY_HOST  # host names, or CIDRs for IP addresses
    spark_conf: tuple[str, ...] = DEFAULT_SPARK_CONF
    spark_packages: tuple[str, ...] = DEFAULT_SPARK_PACKAGES
    priority_classes: tuple[str, ...] = ANY_HOST  # `*`: any, but system-* only when a pattern names system-
    privileged_namespaces: tuple[str, ...] = ()  # whose templates may widen pods (root, privileged, ...)

    def summary(self) -> str:
        """One line for the operator's start-up log."""
        return (
            f"images: {_list(self.own_images + self.images)}; "
            f"service accounts: {_allowed(['none named'], self.service_accounts)} "
            f"(Spark drivers also {_list(self.own_service_accounts)}); "
            f"Secrets labelled {USABLE_LABEL}={USABLE_VALUE}"
            + (f" (any Secret in {_list(self.unlabelled_secrets_namespaces)})"
               if self.unlabelled_secrets_namespaces else "")
            + f"; NATS hosts: {_list(self.nats_hosts)}; sparkConf keys: {_list(self.spark_conf)}"
            + f"; Spark packages: {_list(self.spark_packages)}"
            + f"; priority classes: {_list(self.priority_classes)}"
            + f"; privileged pods in namespaces: {_list(self.privileged_namespaces)}"
        )


def _list(patterns: Iterable[str]) -> str:
    items = list(dict.fromkeys(patterns))
    return ", ".join(items) if items else "none"


def _matches(value: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


# ---- one rule at a time ----
def image_allowed(policy: Policy, image: str) -> bool:
    return image in policy.own_images or _matches(image, policy.images)


def service_account_allowed(policy: Policy, namespace: str, name: str, own: Iterable[str] = ()) -> bool:
    if name in own:
        return True
    return any(
        fnmatch.fnmatchcase(f"{namespace}/{name}" if "/" in pattern else name, pattern)
        for pattern in policy.service_accounts
    )


def secret_usable(policy: Policy, namespace: str, labels: Mapping[str, Any] | None) -> bool:
    """Labelled by its owner, or in a namespace where the administrator turned the check off."""
    if (labels or {}).get(USABLE_LABEL) == USABLE_VALUE:
        return True
    return _matches(namespace, policy.unlabelled_secrets_namespaces)


def hosts_of(urls: str) -> list[str]:
    """The host of each comma-separated NATS URL (`nats://user:pw@host:4222` -> `host`), lower case."""
    hosts = []
    for url in (u.strip() for u in urls.split(",")):
        if not url:
            continue
        if "://" not in url:
            url = f"nats://{url}"
        try:
            host = urllib.parse.urlsplit(url).hostname or ""
        except ValueError:
            host = ""
        hosts.append(host.lower().rstrip("."))
    return hosts


def host_allowed(policy: Policy, host: str) -> bool:
    """A host name matches a name pattern; an IP address also matches a CIDR (`10.0.0.0/8`)."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for pattern in policy.nats_hosts:
        if address is not None and "/" in pattern:
            try:
                network = ipaddress.ip_network(pattern, strict=False)
            except ValueError:
                continue
            if address.version == network.version and address in network:
                return True
        elif fnmatch.fnmatchcase(host, pattern.lower()):
            return True
    return False


# ---- the whole spec ----
def _allowed(own: Iterable[str], patterns: Iterable[str]) -> str:
    return _list([*own, *patterns])


def check(spec: ReplicationSpec, policy: Policy) -> list[Violation]:
    """Everything the spec chooses that the policy does not allow, apart from Secrets (see
    `secret_violations`: their labels live in the API)."""
    found: list[Violation] = []
    fleet = spec.fleet_health

    for field, image in (("spec.image", spec.image), ("spec.fleetHealth.image", fleet and fleet.image)):
        if image and not image_allowed(policy, str(image)):
            found.append(Violation(IMAGE_NOT_ALLOWED, (
                f'{field} "{image}" is not an allowed image (allowed: '
                f"{_allowed(policy.own_images, policy.images)}; set by --allow-image)")))

    accounts = (
        ("spec.serviceAccountName", spec.service_account_name, ()),
        ("spec.fleetHealth.serviceAccount", fleet and fleet.service_account, policy.own_service_accounts),
    )
    for field, account, own in accounts:
        if account and not service_account_allowed(policy, spec.namespace, str(account), own):
            found.append(Violation(SERVICE_ACCOUNT_NOT_ALLOWED, (
                f'{field} "{account}" is not an allowed service account (allowed: '
                f"{_allowed(['none named', *own], policy.service_accounts)}; set by --allow-service-account)")))

    urls = [(_url_field(spec.source), spec.source.url), (_url_field(spec.target), spec.target.url)]
    if fleet and fleet.url:
        urls.append(("spec.fleetHealth.url", fleet.url))
    for field, url in urls:
        for host in dict.fromkeys(hosts_of(url)):
            if not host_allowed(policy, host):
                found.append(Violation(HOST_NOT_ALLOWED, (
                    f'{field}: host "{host}" is not an allowed NATS host (allowed: '
                    f"{_list(policy.nats_hosts)}; set by --allow-nats-host)")))

    for key in sorted((fleet and fleet.spark_conf) or {}):
        if not _matches(str(key), policy.spark_conf):
            found.append(Violation(SPARK_CONF_NOT_ALLOWED, (
                f'spec.fleetHealth.sparkConf "{key}" is not an allowed Spark setting (allowed: '
                f"{_list(policy.spark_conf)}; set by --allow-spark-conf)")))

    for package in (fleet and fleet.packages) or []:
        if not _matches(str(package), policy.spark_packages):
            found.append(Violation(SPARK_PACKAGE_NOT_ALLOWED, (
                f'spec.fleetHealth.packages "{package}" is not an allowed Spark package (allowed: '
                f"{_list(policy.spark_packages)}; set by --allow-spark-package)")))
    found += _template_violations(spec, policy)
    return found


def _url_field(endpoint: Endpoint) -> str:
    """Where a side's URL was written: inline, or in the NatsConnection its connectionRef names."""
    ref = endpoint.connection_ref
    return f'natsconnection "{ref.name}" spec.url ({endpoint.where}.connectionRef)' if ref else f"{endpoint.where}.url"


def _template_violations(spec: ReplicationSpec, policy: Policy) -> list[Violation]:
    """The pod templates' choices (checks/pod_policy.py)."""
    found: list[Violation] = []
    fleet_template = spec.fleet_health.template if spec.fleet_health else None
    for where, shape in (("spec.template", spec.template), ("spec.fleetHealth.template", fleet_template)):
        if shape is None:
            continue
        if not _matches(spec.namespace, policy.privileged_namespaces):
            found += [Violation(POD_SECURITY_NOT_ALLOWED, (
                f"{what} widens what the pods may do: not allowed in namespace \"{spec.namespace}\" (allowed in: "
                f"{_list(policy.privileged_namespaces)}; set by --allow-privileged-pods)"))
                for what in pod_policy.widenings(where, shape.pod, shape.container)]
        priority = shape.pod.priority_class_name if shape.pod else None
        if priority and not pod_policy.priority_class_allowed(priority, policy.priority_classes):
            found.append(Violation(PRIORITY_CLASS_NOT_ALLOWED, (
                f'{where}.pod.priorityClassName "{priority}" is not an allowed priority class (allowed: '
                f"{_list(policy.priority_classes)}; system-* only when named; set by --allow-priority-class)")))
    return found


def secret_violations(
    policy: Policy, namespace: str, labels: Mapping[str, Mapping[str, Any] | None]
) -> list[Violation]:
    """The Secrets (name -> its labels, for those that exist) that resources may not use."""
    return [
        Violation(SECRET_NOT_ALLOWED, (
            f'secret "{name}" in namespace "{namespace}" is not labelled {USABLE_LABEL}={USABLE_VALUE}: '
            "its owner must label it before StreamReplications may use it"))
        for name, secret_labels in labels.items()
        if not secret_usable(policy, namespace, secret_labels)
    ]
