"""The ``delayq spark`` options and commands for clusters: ``--master`` and ``--no-ui`` on
every job, ``pack-env`` (the executors' environment) and ``submit-path`` (the file
``spark-submit`` runs)."""

from __future__ import annotations

import sys
from typing import Any

import click

from delayq.cli._common import EXIT_OK, Args
from delayq.cli.options import PathParam, flag, leaf, master_option, once

__all__ = ["cluster_commands", "prepare_session", "session_options"]


def session_options() -> list[click.Option]:
    """``--master`` and ``--no-ui``: where a Spark job runs, and whether its UI is served."""
    return [
        master_option(),
        flag(
            "--no-ui",
            help="no Spark UI (default: Spark's setting, on unless spark.ui.enabled=false)",
        ),
    ]


def prepare_session(session: Any, args: Args) -> None:
    """Once the job's session runs: say where its UI is, warn about a local ``--errors``
    path on a cluster, and check that the executors' Python can run delayq."""
    from delayq.spark._cluster import check_executors, errors_path_warning

    context = session.sparkContext
    url = context.uiWebUrl
    if url:
        print(f"Spark UI: {url} (--no-ui: none)", file=sys.stderr)
    warning = errors_path_warning(context.master, getattr(args, "errors", None))
    if warning:
        print(f"delayq: warning: {warning}", file=sys.stderr)
    check_executors(session)


def cmd_spark_submit_path(args: Args) -> int:
    from delayq.spark._cluster import entry_point

    print(entry_point())
    return EXIT_OK


def cmd_spark_pack_env(args: Args) -> int:
    from delayq.spark._pack import pack_env

    pack_env(args.out, source=args.source, extra=args.extra)
    return EXIT_OK


def cluster_commands() -> list[click.Command]:
    return [
        leaf(
            "submit-path",
            cmd_spark_submit_path,
            'print the file spark-submit runs: spark-submit ... "$(delayq spark submit-path)" '
            "schedule ...",
            url=False,
            file=False,
        ),
        leaf(
            "pack-env",
            cmd_spark_pack_env,
            "build a venv with delayq for the executors and pack it into OUT.tar.gz "
            "(spark-submit --archives OUT.tar.gz#env --conf spark.pyspark.python=./env/bin/python)",
            [
                click.Argument(["out"], metavar="OUT.tar.gz", type=PathParam()),
                once(
                    "--source",
                    metavar="DIR|WHEEL|REQ",
                    help="what pip installs delayq from (default: the project directory "
                    "delayq was installed from, else delayq==<this version>)",
                ),
                click.Option(
                    ["--with", "extra"],
                    multiple=True,
                    metavar="REQ",
                    help="also install this (e.g. redis for cancel --store redis://); repeatable",
                ),
            ],
            url=False,
            file=False,
        ),
    ]
