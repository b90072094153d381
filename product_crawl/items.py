"""The item a search node collects: one search result of one product on one site (docs/node.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SearchResultItem:
    product: str  # the virtual task's name
    keywords: str  # keywords joined with "&", as in the paper's Table 2
    site: str
    engine: str
    title: str
    url: str
    snippet: str
    date: str | None  # YYYY-MM-DD where the engine shows a date
    rank: int  # 1-based position in the engine's result list
    page: int  # 0-based result page
    task_id: str
    subtask_id: str
    node_id: str
    crawled_at: float  # Unix time
