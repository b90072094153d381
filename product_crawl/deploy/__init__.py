"""Running product_crawl on scrapyd daemons across machines (docs/deploy.md).

- :mod:`.scrapyd`: the targets of ``scrapy.cfg`` (``[deploy:NAME]``), a small client of scrapyd's JSON API that
  names the target in every error, the project's egg, and a scrapyd configuration that always has credentials.
- :mod:`.plan`: pure logic: which jobs ``scrapy cluster up`` schedules where, how a job id names its node, and
  scrapyd's job lists joined with the node registry.

The command is ``scrapy cluster`` (:mod:`product_crawl.commands.cluster`).
"""
