"""How the resource's typed models declare a field: its `kubectl explain` description, the default the
CRD declares (so the API server fills it in, and an object it never defaulted reads the same), and
the formats and bounds that only go into the schema.

Formats and bounds (a pattern, a length, a minimum) are the API server's to enforce, as it does for
every object it admits: they are written into the CRD and not checked again here. The models check
what the operator itself relies on: types, required fields, the enumerations it branches on, and
the cross-field rules whose CEL twins are in the CRD, so that an object the API server never
checked (written before a rule existed, or into the test emulator) is refused in the same words.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Formats the schema shares between fields.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # Secret, account names
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"  # a key of a Secret
JETSTREAM_NAME = r"^[^.*>\s/\\]+$"  # a stream or consumer name
LITERAL_SUBJECT = r"^[^.*>\s]+(\.[^.*>\s]+)*$"  # a subject without wildcards (also an API prefix)
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+$"
NATS_URLS = (r"^(nats|tls|ws|wss)://[^\s/,?]+/?(\?[^\s,]*)?(,\s*(nats|tls|ws|wss)://[^\s/,?]+/?(\?[^\s,]*)?)*$")
QUANTITY = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
            r"|(\.[0-9]+))))?$")
SPARK_MEMORY = r"^[0-9]+[kmgtKMGT]?$"


class Model(BaseModel):
    """A part of the resource: camelCase in the API, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True,
                              coerce_numbers_to_str=True)


class OpenModel(Model):
    """A part the operator passes on as it is (a core/v1 shape): fields it does not model stay."""

    model_config = ConfigDict(extra="allow")


def field(description: str, default: Any = ..., *, default_factory: Any = None, schema_default: Any = None,
          **schema: Any) -> Any:
    """A field: `default` (not None) is also the CRD's default; `default_factory` gives Python a value
    while the CRD declares `schema_default`, or none; `schema` holds JSON Schema keywords for the CRD
    alone (`pattern`, `maxLength`, `minimum`, `format`, `enum`, `x-kubernetes-...`)."""
    if schema_default is not None:
        schema["default"] = schema_default
    extra = schema or None
    if default_factory is not None:
        return Field(default_factory=default_factory, description=description, json_schema_extra=extra)
    return Field(default, description=description, json_schema_extra=extra)


def name_field(description: str, default: Any = ...) -> Any:
    """A Kubernetes object's name (a Secret, a service account)."""
    return field(description, default, maxLength=253, pattern=DNS_SUBDOMAIN)


def key_field(description: str, default: Any = ...) -> Any:
    """A key of a Secret."""
    return field(description, default, maxLength=253, pattern=SECRET_KEY)


def duration_field(description: str, default: Any = None) -> Any:
    return field(description, default, maxLength=64, pattern=DURATION)
