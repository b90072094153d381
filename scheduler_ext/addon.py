"""Scrapy add-ons that turn a project's spider into a crawl node or a control process.

In a spider's ``custom_settings`` (or a project's settings)::

    ADDONS = {"scheduler_ext.addon.NodeAddon": 0}      # the spider is a crawl node fed from Redis
    ADDONS = {"scheduler_ext.addon.ControlAddon": 0}   # the process runs the control loop

Settings already given explicitly at a higher priority (project, spider, command line) win over what an add-on
sets; the components it adds keep any order the project gave them.
"""

from __future__ import annotations

from typing import Any

# Nodes take orders from Redis only: no telnet console, no remote control, no local-file handlers.
_LOCKED_DOWN = {"TELNETCONSOLE_ENABLED": False, "REMOTE_CONTROL_ENABLED": False}
_OFF_HANDLERS = ("file", "data", "ftp", "s3")
NODE_CONCURRENT_ITEMS = 20


def _lock_down(settings: Any) -> None:
    for name, value in _LOCKED_DOWN.items():
        settings.set(name, value, "addon")
    for scheme in _OFF_HANDLERS:
        settings["DOWNLOAD_HANDLERS"][scheme] = None


class NodeAddon:
    """The subtask scheduler, its middlewares and the Redis stats collector; nodes locked down."""

    def update_settings(self, settings: Any) -> None:
        settings.set("SCHEDULER", "scheduler_ext.scheduler.SubtaskScheduler", "addon")
        settings.set("STATS_CLASS", "scheduler_ext.stats.RedisStatsCollector", "addon")
        # Scrapy starts CONCURRENT_ITEMS worker tasks for every response (default 100). A result page holds at
        # most 20 results (Weibo's), so 20 let all of a page's items share one MongoDB group commit at a fifth of
        # the per-page cost (about 0.8 ms of CPU a page; docs/settings.md).
        settings.set("CONCURRENT_ITEMS", NODE_CONCURRENT_ITEMS, "addon")
        # No per-response and per-item DEBUG records built only to be dropped below LOG_LEVEL (logformatter.py).
        settings.set("LOG_FORMATTER", "scheduler_ext.logformatter.NodeLogFormatter", "addon")
        # Scrapy's downloader, with CONCURRENT_REQUESTS_PER_DOMAIN kept under the asyncio reactor (downloader.py).
        settings.set("DOWNLOADER", "scheduler_ext.downloader.Downloader", "addon")
        from .middleware import SubtaskDownloaderMiddleware, SubtaskSpiderMiddleware

        settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", SubtaskDownloaderMiddleware, 900)
        settings.setdefault_in_component_priority_dict("SPIDER_MIDDLEWARES", SubtaskSpiderMiddleware, 950)
        _lock_down(settings)


class ControlAddon:
    """The control loop (``ControlExtension``) in this process."""

    def update_settings(self, settings: Any) -> None:
        settings.set("SCHEDEXT_CONTROL_ENABLED", True, "addon")
        from .control import ControlExtension

        settings.setdefault_in_component_priority_dict("EXTENSIONS", ControlExtension, 500)
        _lock_down(settings)
