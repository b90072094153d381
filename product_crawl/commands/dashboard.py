"""``scrapy dashboard [--host 127.0.0.1] [--port 6802]``: the live web dashboard (docs/dashboard.md)."""

from __future__ import annotations

import argparse
import logging

import pymongo
from scrapy.commands import ScrapyCommand
from scrapy.utils.log import configure_logging
from scrapy.utils.reactor import install_reactor
from twisted.internet.error import CannotListenError

from product_crawl.commands._base import open_store, seconds, write_error, write_line
from product_crawl.dashboard.auth import Auth, CredentialsError
from product_crawl.dashboard.data import DashboardData
from product_crawl.dashboard.server import LISTENING_PREFIX, Dashboard, is_loopback
from product_crawl.services import DEFAULT_MONGO_URI, check_mongo_uri, tcp_port
from scheduler_ext.defaults import setting_float, setting_int
from scheduler_ext.exceptions import ConfigurationError
from scheduler_ext.history import History

logger = logging.getLogger(__name__)


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_LEVEL": "INFO"}

    def short_desc(self) -> str:
        return "Serve the live web dashboard (cluster, completion matrix, products, dead letters, items)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--host", default=None, help="address to listen on (default PC_DASHBOARD_HOST, "
                                                          "127.0.0.1)")
        parser.add_argument("--port", type=tcp_port, default=None, help="TCP port (default PC_DASHBOARD_PORT, 6802; "
                                                                   "0 picks a free one)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        s = self.settings
        host = opts.host or s.get("PC_DASHBOARD_HOST") or "127.0.0.1"
        try:
            port = opts.port if opts.port is not None else tcp_port(s.get("PC_DASHBOARD_PORT", 6802))
        except argparse.ArgumentTypeError as exc:
            write_error(f"PC_DASHBOARD_PORT: {exc}")
            self.exitcode = 2
            return
        try:
            # Seconds between the page's polls; it also goes to the browser as JSON, where NaN is not a number.
            refresh = seconds(s.get("PC_DASHBOARD_REFRESH", 2.0), maximum=3600.0)
        except argparse.ArgumentTypeError as exc:
            write_error(f"PC_DASHBOARD_REFRESH: {exc}")
            self.exitcode = 2
            return
        try:
            auth = Auth.from_settings(s)
            check_mongo_uri(s.get("MONGO_URI") or DEFAULT_MONGO_URI)
        except (CredentialsError, ConfigurationError) as exc:
            write_error(str(exc))
            self.exitcode = 2
            return
        store = open_store(s)
        if store is None:
            self.exitcode = 1
            return
        configure_logging(s)
        ms = 3000  # a dashboard read must fail fast, not hang a thread of the pool
        mongo: pymongo.MongoClient = pymongo.MongoClient(s.get("MONGO_URI") or DEFAULT_MONGO_URI,
                                                         serverSelectionTimeoutMS=ms, socketTimeoutMS=ms * 10)
        collection = mongo[s.get("MONGO_DATABASE") or "product_crawl"][s.get("PC_MONGO_COLLECTION") or "items"]
        interval = setting_float(s, "SCHEDEXT_HISTORY_INTERVAL")
        history = History(store, interval, setting_int(s, "SCHEDEXT_HISTORY_MAXLEN"))
        data = DashboardData(store, history, collection,
                             recall_threshold=setting_float(s, "SCHEDEXT_RECALL_THRESHOLD"),
                             status_ttl=min(1.0, refresh / 2), audit_maxlen=setting_int(s, "SCHEDEXT_AUDIT_MAXLEN"))
        install_reactor(s.get("TWISTED_REACTOR") or "twisted.internet.asyncioreactor.AsyncioSelectorReactor")
        from twisted.internet import reactor

        dashboard = Dashboard(data, auth, refresh=refresh, history_interval=interval)
        try:
            url = dashboard.listen(host, port)
        except CannotListenError as exc:
            # The address or the port may be at fault (a name that does not resolve, a port in use).
            write_error(f"cannot listen on host {host!r} port {port} (--host / PC_DASHBOARD_HOST, "
                        f"--port / PC_DASHBOARD_PORT): {exc.socketError}")
            self.exitcode = 1
            return
        if not is_loopback(host) and not auth.actions_enabled:
            logger.warning("dashboard listens on %s: anyone who reaches it can read the deployment's state", host)
        logger.info("dashboard for prefix %s: %s (%s)", store.keys.prefix, url,
                    "actions by " + " or ".join(auth.methods) if auth.actions_enabled else "read-only")
        write_line(LISTENING_PREFIX + url)
        reactor.addSystemEventTrigger("before", "shutdown", dashboard.stop)
        reactor.run()
        mongo.close()
