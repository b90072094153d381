"""The add-ons configure a crawler as a node or a control (Scrapy's own add-on loading, no services needed)."""

from __future__ import annotations

from scrapy.utils.test import get_crawler

from product_crawl.spiders.control import ControlSpider
from product_crawl.spiders.search import SearchSpider
from scheduler_ext.control import ControlExtension
from scheduler_ext.middleware import SubtaskDownloaderMiddleware, SubtaskSpiderMiddleware


def _settings(spider_cls: type, **extra: object) -> object:
    crawler = get_crawler(spider_cls, settings_dict=dict(extra))
    crawler._apply_settings()  # as Crawler.crawl does (a no-op if get_crawler already did)
    return crawler.settings


def test_node_addon_makes_the_search_spider_a_locked_down_node() -> None:
    s = _settings(SearchSpider)
    assert s["SCHEDULER"] == "scheduler_ext.scheduler.SubtaskScheduler"
    assert s["STATS_CLASS"] == "scheduler_ext.stats.RedisStatsCollector"
    assert s["DOWNLOADER"] == "scheduler_ext.downloader.Downloader"
    assert s.getdict("DOWNLOADER_MIDDLEWARES")[SubtaskDownloaderMiddleware] == 900
    assert s.getdict("SPIDER_MIDDLEWARES")[SubtaskSpiderMiddleware] == 950
    assert not s.getbool("TELNETCONSOLE_ENABLED") and not s.getbool("REMOTE_CONTROL_ENABLED")
    handlers = s.getdict("DOWNLOAD_HANDLERS")
    assert all(handlers[scheme] is None for scheme in ("file", "data", "ftp", "s3"))


def test_node_addon_keeps_a_projects_own_middleware_order() -> None:
    path = "scheduler_ext.middleware.SubtaskDownloaderMiddleware"
    s = _settings(SearchSpider, DOWNLOADER_MIDDLEWARES={path: 10})
    middlewares = s.getdict("DOWNLOADER_MIDDLEWARES")
    assert middlewares[path] == 10 and SubtaskDownloaderMiddleware not in middlewares


def test_control_addon_enables_the_control_loop() -> None:
    s = _settings(ControlSpider)
    assert s.getbool("SCHEDEXT_CONTROL_ENABLED")
    assert s.getdict("EXTENSIONS")[ControlExtension] == 500
    assert not s.getbool("TELNETCONSOLE_ENABLED")


def test_node_addon_runs_a_result_pages_items_together_unless_the_project_says_otherwise() -> None:
    from product_crawl.engines import baidu, weibo
    from scheduler_ext.addon import NODE_CONCURRENT_ITEMS

    pages = [cls.page_size for mod in (baidu, weibo) for cls in vars(mod).values()
             if isinstance(cls, type) and isinstance(getattr(cls, "page_size", None), int)]
    assert pages and NODE_CONCURRENT_ITEMS >= max(pages)  # one page's items share one group commit
    assert _settings(SearchSpider).getint("CONCURRENT_ITEMS") == NODE_CONCURRENT_ITEMS
    assert _settings(SearchSpider, CONCURRENT_ITEMS=50).getint("CONCURRENT_ITEMS") == 50


def test_node_log_formatter_builds_per_page_and_per_item_records_only_at_debug() -> None:
    from scrapy import Request
    from scrapy.http import TextResponse

    from scheduler_ext.logformatter import NodeLogFormatter

    assert _settings(SearchSpider)["LOG_FORMATTER"] == "scheduler_ext.logformatter.NodeLogFormatter"
    mine = "scrapy.logformatter.LogFormatter"  # a project's own wins
    assert _settings(SearchSpider, LOG_FORMATTER=mine)["LOG_FORMATTER"] == mine
    request = Request("http://www.baidu.com/s?wd=x")
    response = TextResponse(request.url, body=b"<html></html>", encoding="utf-8", request=request)
    for level, shown in (("INFO", False), ("WARNING", False), ("DEBUG", True), (10, True), (20, False)):
        crawler = get_crawler(SearchSpider, settings_dict={"LOG_LEVEL": level})
        formatter = NodeLogFormatter.from_crawler(crawler)
        assert (formatter.crawled(request, response, None) is not None) is shown, level
        assert (formatter.scraped({"title": "t"}, response, None) is not None) is shown, level
        # Whatever the level, the messages a user needs stay Scrapy's own.
        assert formatter.download_error(ValueError("bad"), request, None)["level"] == 40
