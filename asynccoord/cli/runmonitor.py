"""The ``run`` command's monitoring outputs: alert webhooks and a Prometheus endpoint.

A process hosted by ``python -m asynccoord run`` has a :class:`~asynccoord.monitor.monitor.Monitor`
like an embedded one; the leader's monitor hands each cluster alert to its sinks. These
options give the command's monitor what an embedding process gives its own: ``--alert-webhook
URL`` (a :class:`~asynccoord.monitor.webhook.WebhookSink` per URL, extra ``webhook``), with
``--alert-label NAME=VALUE`` (labels naming the cluster in every notice), and
``--metrics-port PORT`` (the process's counters, latencies and alerts, and gauges of its
queue's backlog and live nodes, in Prometheus' text format on ``http://HOST:PORT/metrics``,
served by ``prometheus_client`` on a registry of its own, extra ``metrics``).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidArgumentError
from ..validation import check_int, check_name

__all__ = (
    "add_monitor_options",
    "alert_labels",
    "alert_sinks",
    "check_monitor_options",
    "export",
    "serve_metrics",
)


def add_monitor_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--alert-webhook``, ``--alert-label``, ``--metrics-port`` and ``--metrics-host`` to ``parser``."""
    parser.add_argument(
        "--alert-webhook",
        action="append",
        default=[],
        metavar="URL",
        help="POST every alert notice as JSON to URL (extra 'webhook'); repeat for several. Each process "
        "gives its own: the monitor that leads the cluster raises its alerts",
    )
    parser.add_argument(
        "--alert-label",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --alert-webhook: a label sent with every alert notice, such as cluster=prod (in the body's "
        "'labels' and at the start of its 'text'); repeat for several",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve this process's metrics for Prometheus on http://HOST:PORT/metrics (extra 'metrics')",
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", metavar="HOST", help="address of --metrics-port (default 127.0.0.1)"
    )


def check_monitor_options(args: argparse.Namespace) -> None:
    """Check the monitoring options before anything is opened.

    Raises:
        InvalidArgumentError: a URL that is no http(s) URL with a host, a port outside
            1..65535, ``--metrics-host`` without ``--metrics-port``, or an extra not installed.
    """
    alert_sinks(args)  # builds and drops them: a sink opens nothing before the monitor starts it
    port = getattr(args, "metrics_port", None)
    host = getattr(args, "metrics_host", "127.0.0.1")
    if port is None:
        if host != "127.0.0.1":
            raise InvalidArgumentError(f"--metrics-host {host!r} applies with --metrics-port only")
        return
    check_int("--metrics-port", port, minimum=1, maximum=65535)
    check_name("--metrics-host", host)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise InvalidArgumentError(
            "--metrics-port needs prometheus_client: pip install 'asynccoord[metrics]'"
        ) from None


def alert_sinks(args: argparse.Namespace) -> list[Any]:
    """One :class:`~asynccoord.monitor.webhook.WebhookSink` per ``--alert-webhook`` URL.

    Raises:
        InvalidArgumentError: a URL the sink refuses, or aiohttp missing (extra ``webhook``).
    """
    urls = getattr(args, "alert_webhook", None) or []
    labels = alert_labels(getattr(args, "alert_label", None) or [])
    if not urls:
        if labels:
            raise InvalidArgumentError("--alert-label applies to --alert-webhook only: add --alert-webhook URL")
        return []
    try:
        from ..monitor.webhook import WebhookSink

        return [WebhookSink(url, labels=labels) for url in urls]
    except ImportError:
        raise InvalidArgumentError("--alert-webhook needs aiohttp: pip install 'asynccoord[webhook]'") from None
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"--alert-webhook: {exc}") from None


def alert_labels(specs: list[str]) -> dict[str, str]:
    """The labels of ``--alert-label NAME=VALUE`` options, in order (a name given twice keeps its last value).

    Raises:
        InvalidArgumentError: an option without ``=``, or with an empty or blank name, or a
            label :class:`~asynccoord.monitor.webhook.WebhookSink` refuses
            (:func:`~asynccoord.monitor.webhook.check_labels`), named as ``--alert-label``'s.
    """
    from ..monitor.webhook import check_labels  # aiohttp is imported by the sink only

    labels: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name.strip():
            raise InvalidArgumentError(f"--alert-label {spec!r}: give NAME=VALUE, as in --alert-label cluster=prod")
        labels[name.strip()] = value
    try:
        return check_labels(labels)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"--alert-label: {exc}") from None


@contextlib.contextmanager
def serve_metrics(args: argparse.Namespace) -> Iterator[Any]:
    """Serve a registry of its own on ``--metrics-port`` while the block runs; yield it (None without the option).

    Bound before the store opens, so a taken port stops the command before it touches the
    database; :func:`export` then puts the store's and the monitor's metrics on it.

    Raises:
        InvalidArgumentError: the address cannot be bound (the port is taken, say).
    """
    port = getattr(args, "metrics_port", None)
    if port is None:
        yield None
        return
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    try:
        server, thread = start_http_server(port, addr=args.metrics_host, registry=registry)
    except OSError as exc:
        raise InvalidArgumentError(
            f"--metrics-port {port}: cannot listen on {args.metrics_host}:{port}: {exc}"
        ) from exc
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)


def export(registry: Any, store: Any, monitor: Any, lock_store: Any, queue: str) -> None:
    """Put ``store``'s and ``monitor``'s metrics, and ``queue``'s gauges, on ``registry`` (nothing if None).

    ``registry`` comes from :func:`serve_metrics`; called on the event loop the store runs on,
    which the queue gauges read it on (:mod:`asynccoord.monitor.gauges`).
    """
    if registry is None:
        return
    from ..monitor.metrics import register_collector

    register_collector(store, monitor, registry, lock_store=lock_store, queues=[queue])
