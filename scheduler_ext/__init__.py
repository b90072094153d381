"""scheduler_ext: a reusable Scrapy extension for Redis-coordinated, dynamically scheduled crawling.

It knows subtasks, nodes, queues, leases, run records and strategies, and nothing about what is crawled:
a project plugs in a splitter (what a submitted job becomes) and a spider that turns a subtask into requests.
"""

SCHEMA_VERSION = 1
