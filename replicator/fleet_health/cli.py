"""`stream-replicator fleet-health [run]` and the spark-submit application share these arguments;
`stream-replicator fleet-health report` draws the job's history."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from replicator.fleet_health.connection import NatsConnection
from replicator.fleet_health.jetstream import stream_for_subject
from replicator.fleet_health.summary import DEFAULT_BUCKET

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="NATS URL(s) of the advisory cluster, comma-separated")
    parser.add_argument("--stream", default=None, help="the advisory stream (default: the one storing --subject)")
    parser.add_argument("--subject", default=None, help="read only this subject (the advisory subject)")
    parser.add_argument("--output", required=True, help="Parquet output root: a path or a Hadoop URI (s3a://...)")
    parser.add_argument("--kv-bucket", default=DEFAULT_BUCKET, help="KV bucket for the summary (%(default)s)")
    parser.add_argument(
        "--partitions", type=int, default=2, help="parallel reads of the stream, ideally executors x cores"
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master (%(default)s); 'submit' leaves it to spark-submit",
    )
    auth = parser.add_argument_group("NATS authentication and TLS (file paths, read by the driver and every executor)")
    auth.add_argument("--credentials", default=None, help="NATS credentials (.creds) file")
    auth.add_argument("--user-jwt", default=None, help="user JWT file (decentralised auth), with --nkey-seed")
    auth.add_argument("--nkey-seed", default=None, help="user nkey seed file: signs the server's nonce")
    auth.add_argument("--user-file", default=None, help="file holding the NATS user name, with --password-file")
    auth.add_argument("--password-file", default=None,
                      help="file holding the user's password (kept out of the command line, read at each connect)")
    auth.add_argument("--token-file", default=None,
                      help="file holding a NATS token (token authentication; kept out of the URL, read at each "
                           "connect)")
    auth.add_argument("--tls-scheme", choices=("manual", "puppet"), default=None,
                      help="manual: --tls-ca/--tls-cert/--tls-key; puppet: --tls-ssl-dir and --tls-identity")
    auth.add_argument("--tls-ca", default=None, help="CA bundle that verifies the servers")
    auth.add_argument("--tls-cert", default=None, help="client certificate (with --tls-key)")
    auth.add_argument("--tls-key", default=None, help="client certificate's private key")
    auth.add_argument("--tls-ssl-dir", default=None,
                      help="Puppet ssl dir: certs/ca.pem, certs/<identity>.pem, private_keys/<identity>.pem")
    auth.add_argument("--tls-identity", default=None, help="Puppet identity (default: this host's FQDN)")
    auth.add_argument("--tls-insecure", action="store_true", help="do not verify the servers' certificates")
    parser.add_argument("--now", type=int, default=None, help="the run's clock, unix seconds (default: now)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    parser.add_argument("--verbose", action="store_true",
                        help="also print Spark's start-up messages and the job's progress log")


def connection_from_args(args: argparse.Namespace) -> NatsConnection:
    """`ValueError` naming the flags that do not go together."""
    try:
        return NatsConnection.build(
            args.url, credentials=args.credentials, user_jwt=args.user_jwt, nkey_seed=args.nkey_seed,
            user_file=args.user_file, password_file=args.password_file, token_file=args.token_file,
            tls_scheme=args.tls_scheme, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
            tls_ssl_dir=args.tls_ssl_dir, tls_identity=args.tls_identity, tls_insecure=args.tls_insecure,
        )
    except ValueError as err:
        text = str(err)
        for option, flag in _FLAGS.items():
            text = text.replace(option, flag)
        raise ValueError(text) from None


def check_files(args: argparse.Namespace, connection: NatsConnection) -> None:
    """Unreadable files fail at start (exit 2), naming the flag, as the replicator's config check does."""
    for role, path in connection.files.paths().items():
        if not os.access(path, os.R_OK):
            flag = "--tls-ssl-dir/--tls-identity" if args.tls_ssl_dir and role in ("ca", "cert", "key") \
                else _FILE_FLAGS[role]
            raise ValueError(f"{flag}: file {path} is not readable")


_FILE_FLAGS = {"ca": "--tls-ca", "cert": "--tls-cert", "key": "--tls-key", "creds": "--credentials",
               "jwt": "--user-jwt", "seed": "--nkey-seed", "username": "--user-file", "password": "--password-file",
               "token": "--token-file"}


# The connection's messages name reader options (and the config file's tls keys); here, flags.
_FLAGS = {"user_jwt": "--user-jwt", "nkey_seed": "--nkey-seed", "credentials": "--credentials",
          "user_file": "--user-file", "password_file": "--password-file", "token_file": "--token-file",
          "tls_scheme": "--tls-scheme", "cert and key": "--tls-cert and --tls-key", "ssl_dir": "--tls-ssl-dir"}


def run_from_args(args: argparse.Namespace) -> int:
    """Exit status: 0 done, 1 the run failed (the previous committed state is kept), 2 bad arguments."""
    # Imported here: PySpark is an optional dependency and slow to import.
    from replicator.fleet_health.job import run_fleet_health
    from replicator.fleet_health.report import format_tables

    if args.verbose:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("replicator").setLevel(logging.INFO)
    if args.partitions < 1:
        print("fleet-health: --partitions must be at least 1", file=sys.stderr)
        return 2
    if not args.stream and not args.subject:
        print("fleet-health: --stream or --subject is required", file=sys.stderr)
        return 2
    try:
        connection = connection_from_args(args)
        check_files(args, connection)
    except ValueError as err:
        print(f"fleet-health: {err}", file=sys.stderr)
        return 2
    try:
        stream = args.stream or asyncio.run(stream_for_subject(connection, args.subject))
        result = run_fleet_health(
            connection,
            stream,
            args.output,
            kv_bucket=args.kv_bucket,
            partitions=args.partitions,
            master=None if args.master == "submit" else args.master,
            now=args.now,
            subject=args.subject,
            quiet=not args.verbose,
        )
    except Exception as exc:  # the command's boundary: one line and exit 1 (the traceback with --verbose)
        log.debug("fleet-health failed", exc_info=True)
        print(f"fleet-health: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.summary, indent=2) if args.json else format_tables(result))
    return 0


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, help="the fleet-health job's output root (its --output)")
    parser.add_argument("--html", required=True, type=Path, metavar="FILE", help="write the page here")
    parser.add_argument("--max-nodes", type=int, default=1000,
                        help="node table rows, least healthy first (%(default)s)")


def report_from_args(args: argparse.Namespace) -> int:
    """Exit status: 0 written, 2 nothing to report from (not a fleet-health output), 1 it failed."""
    if args.max_nodes < 1:
        print("fleet-health report: --max-nodes must be at least 1", file=sys.stderr)
        return 2
    try:  # PyArrow and Plotly are extras, imported only here
        from replicator.fleet_health.history import HistoryError
        from replicator.fleet_health.html_report import write_report
    except ImportError as err:
        print(f"fleet-health report: {err} (install with: pip install 'stream-replicator[spark,report]')",
              file=sys.stderr)
        return 1
    try:
        history = write_report(args.output, args.html, max_nodes=args.max_nodes)
    except HistoryError as err:
        print(f"fleet-health report: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"fleet-health report: cannot write {args.html}: {err}", file=sys.stderr)
        return 1
    print(f"fleet-health report: {len(history.runs)} runs, {len(history.nodes)} nodes: {args.html}")
    return 0
