"""The live web dashboard: ``scrapy dashboard`` (docs/dashboard.md)."""
