"""Scrapy settings of the product_crawl project.

Services: ``REDIS_URL`` and ``MONGO_URI`` come from the environment when set; otherwise the embedded defaults
on 127.0.0.1 (started by ``scrapy services start``). Our own settings use the ``PC_`` prefix; the scheduling
extension's use ``SCHEDEXT_`` (defaults in scheduler_ext/defaults.py). See docs/settings.md.
"""

import os

BOT_NAME = "product_crawl"
SPIDER_MODULES = ["product_crawl.spiders"]
NEWSPIDER_MODULE = "product_crawl.spiders"
COMMANDS_MODULE = "product_crawl.commands"

TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
ROBOTSTXT_OBEY = False
LOG_LEVEL = os.environ.get("PC_LOG_LEVEL", "INFO")

# --- services ---------------------------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL") or None  # None: the embedded default redis://127.0.0.1:6379/0
MONGO_URI = os.environ.get("MONGO_URI") or None  # None: the embedded default mongodb://127.0.0.1:27017
MONGO_DATABASE = os.environ.get("MONGO_DATABASE", "product_crawl")
PC_MONGO_COLLECTION = "items"
PC_EMBEDDED_REDIS_URL = "redis://127.0.0.1:6379/0"  # where embedded servers run when nothing is configured
PC_EMBEDDED_MONGO_URI = "mongodb://127.0.0.1:27017"
PC_SERVICES_DIR = os.environ.get("PC_SERVICES_DIR", "var")  # pid files, logs and data of embedded servers

# --- engines ------------------------------------------------------------------------------------------------
# Base URL per engine; the demo, the tests and the experiment point them at the simulated web.
PC_ENGINE_BASE_URLS = {"baidu": "http://www.baidu.com", "weibo": "http://weibo.yunyun.com", "sweibo": "https://s.weibo.com"}
PC_WEIBO_EXTRA_WORD = "投诉"
PC_WEIBO_COOKIES = ""  # s.weibo.com session (Cookie header value); or PC_WEIBO_COOKIES_FILE, a file holding it
PC_WEIBO_COOKIES_FILE = ""

# --- scheduling -------------------------------------------------------------------------------------------------
SCHEDEXT_SPLITTER = "product_crawl.tasks.splitter"
