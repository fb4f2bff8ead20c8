"""The StreamReplication CRD, generated from the typed models: `crds/` and the Helm chart's `crds/`
hold this module's output, and a test keeps them equal to it.

Regenerate after changing a model: `make crd` (`python -m replication_operator.model.crd FILE...`
writes the files that differ; with `--check` it only names them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from replication_operator.model import naming
from replication_operator.model.connection import NatsConnection
from replication_operator.model.fields import Model, field
from replication_operator.model.openapi import structural
from replication_operator.model.spec import StreamReplicationSpec
from replication_operator.model.status_schema import StreamReplicationStatus

HEADER = """\
# StreamReplication: one replicated NATS JetStream stream (or subject), run by the
# stream-replicator operator as a worker Deployment (engine replicator) or as a source entry that
# NATS itself copies through (engine native). Field reference: docs/operator.md, or kubectl explain.
# Generated from operator/model/ (the typed models): edit those, then run `make crd`.
"""
FILENAME = f"{naming.PLURAL}.{naming.GROUP}.yaml"
CONNECTION_HEADER = """\
# NatsConnection: one NATS cluster's URLs, TLS and credential Secrets, named by the source and target
# of many StreamReplications (connectionRef). Field reference: docs/connections.md, or kubectl explain.
# Generated from operator/model/ (the typed models): edit those, then run `make crd`.
"""
CONNECTION_FILENAME = f"{naming.CONNECTION_PLURAL}.{naming.GROUP}.yaml"


class StreamReplication(Model):
    api_version: str | None = field(
        "APIVersion defines the versioned schema of this representation of an object.", None)
    kind: str | None = field("Kind is a string value representing the REST resource this object represents.", None)
    metadata: dict[str, Any] | None = field("Standard object metadata: name, namespace, labels, annotations.", None)
    spec: StreamReplicationSpec = field(
        "What to replicate: from which source, to which target, by which engine, sampled or not.")
    status: StreamReplicationStatus | None = field("What the operator observed; written by the operator only.",
                                                   None)


ROOT_RULES = [{
    "rule": "size(self.metadata.name) <= 50 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "message": "metadata.name must be a DNS-1035 label of at most 50 characters (lower case letters, digits and "
               "'-', starting with a letter): it names the worker Deployment, Service and labels"}]
ROOT_DESCRIPTION = (
    "StreamReplication copies a NATS JetStream stream (or a subject of it) from a source cluster to a target "
    "cluster, in order or scaled out, optionally sampling it and publishing advisories about the senders.")
PRINTER_COLUMNS = [
    {"name": "Engine", "type": "string",
     "description": "The engine in charge (native or replicator); the Engine condition says why.",
     "jsonPath": ".status.engine"},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Lag", "type": "integer",
     "description": "Messages not yet copied (the replicator's consumer, or NATS's source entry).",
     "jsonPath": ".status.lag"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Status", "type": "string", "description": "Reason of the Ready condition.",
     "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
]


def schema() -> dict[str, Any]:
    """The version's openAPIV3Schema."""
    root = structural(StreamReplication)
    return {"type": "object", "description": ROOT_DESCRIPTION, "required": root["required"],
            "x-kubernetes-validations": ROOT_RULES, "properties": root["properties"]}


def _definition(kind: str, plural: str, names: dict[str, list[str]], subresources: dict[str, Any],
                columns: list[dict[str, Any]], openapi: dict[str, Any]) -> dict[str, Any]:
    """One namespaced CRD of the group, served and stored at its single version."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{naming.GROUP}",
            "labels": {naming.LABEL_NAME: naming.APP_NAME, naming.LABEL_COMPONENT: "crd"},
        },
        "spec": {
            "group": naming.GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                      **names},
            "versions": [{
                "name": naming.VERSION,
                "served": True,
                "storage": True,
                "subresources": subresources,
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": openapi},
            }],
        },
    }


def crd() -> dict[str, Any]:
    scale = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
             "labelSelectorPath": ".status.selector"}
    return _definition(naming.KIND, naming.PLURAL,
                       {"shortNames": ["srep"], "categories": ["all", "streamreplicator"]},
                       {"status": {}, "scale": scale}, PRINTER_COLUMNS, schema())


CONNECTION_DESCRIPTION = (
    "NatsConnection holds how to reach one NATS cluster (URLs, TLS, one way to authenticate, as Secret "
    "references) for the StreamReplications of its namespace that name it in spec.source.connectionRef or "
    "spec.target.connectionRef.")
CONNECTION_COLUMNS = [
    {"name": "URL", "type": "string", "jsonPath": ".spec.url"},
    {"name": "Connected", "type": "string", "description": "Whether the operator could sign in with it.",
     "jsonPath": '.status.conditions[?(@.type=="Connected")].status'},
    {"name": "Users", "type": "string", "description": "StreamReplications that name it.",
     "jsonPath": ".status.users"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def connection_crd() -> dict[str, Any]:
    """The NatsConnection CRD: its spec is the side models' connection (model/connection.py)."""
    root = structural(NatsConnection)
    openapi = {"type": "object", "description": CONNECTION_DESCRIPTION, "required": root["required"],
               "properties": root["properties"]}
    return _definition(naming.CONNECTION_KIND, naming.CONNECTION_PLURAL,
                       {"shortNames": ["natsconn"], "categories": ["streamreplicator"]},
                       {"status": {}}, CONNECTION_COLUMNS, openapi)


class _Dumper(yaml.SafeDumper):
    """Lists indented under their key, prose folded (`>-`), short words and rules as they are."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = ">" if len(value) > 80 and " " in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render() -> str:
    """The CRD file's text."""
    return HEADER + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)


def render_connection() -> str:
    """The NatsConnection CRD file's text."""
    return CONNECTION_HEADER + yaml.dump(connection_crd(), Dumper=_Dumper, sort_keys=False, width=110,
                                         allow_unicode=True)


def text_for(path: Path) -> str:
    """The text a CRD file should hold, by its name: the NatsConnection's, else the StreamReplication's."""
    return render_connection() if path.name == CONNECTION_FILENAME else render()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replication_operator.model.crd", description=__doc__)
    parser.add_argument("files", nargs="*", type=Path,
                        help=f"CRD files ({FILENAME}, {CONNECTION_FILENAME}); none: print the first")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs from the models")
    args = parser.parse_args(argv)
    if not args.files:
        sys.stdout.write(render())
        return 0
    stale = [path for path in args.files if not path.is_file() or path.read_text() != text_for(path)]
    if args.check:
        for path in stale:
            print(f"{path} differs from the typed models: run `make crd`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(text_for(path))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
