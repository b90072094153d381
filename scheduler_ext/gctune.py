"""The garbage collector of a node or control process, tuned so that it does not stop the reactor.

CPython's cyclic collector runs on allocation counts: a young collection every 700 container objects allocated, an
old one (every object the process holds) every 100 young ones or so. A crawl node allocates requests, responses,
items and Deferreds by the thousand a second, so it collects young objects about 30 times a second and its whole
heap every four seconds; on a shared machine (four nodes, the web, the storage on two cores) a collection of the
whole heap stopped a node's reactor for about 120 ms (measured with ``gc.callbacks`` in the ``paper`` experiment:
7 full collections in 28 s, 0.8 s, and 1.7 s of collections in all, every download finishing meanwhile waiting).

:class:`GcTuning` (an extension both add-ons enable) acts once the engine has started:

* ``gc.freeze()``: what the process built to start (modules, settings, the spider, the parser's dictionaries)
  lives as long as the process, and is moved out of the collector's sight: full collections scan only what the
  crawl allocated since;
* the young generation's threshold becomes ``SCHEDEXT_GC_THRESHOLD`` (default 20,000 objects): fewer, larger young
  collections; most of a page's objects die young, by reference counting, before one runs.

Measured on the same experiment: collections in all 1.7 s -> 0.33 s per node in 28 s, none of the whole heap over
60 ms. ``SCHEDEXT_GC_THRESHOLD = 0`` leaves the interpreter's collector as it is. The engine's stop undoes both
(a process that runs several crawls, as the tests do, gets its collector back).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from .config import config_for

logger = logging.getLogger(__name__)


class GcTuning:
    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._saved: tuple[int, ...] | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> GcTuning:
        threshold = config_for(crawler).gc_threshold
        if threshold <= 0:
            raise NotConfigured("SCHEDEXT_GC_THRESHOLD is 0: the interpreter's collector is left as it is")
        ext = cls(threshold)
        crawler.signals.connect(ext.engine_started, signal=signals.engine_started)
        crawler.signals.connect(ext.engine_stopped, signal=signals.engine_stopped)
        return ext

    def engine_started(self) -> None:
        if self._saved is not None:
            return
        self._saved = gc.get_threshold()
        gc.collect()  # the start-up's garbage is not frozen with what it keeps
        gc.freeze()
        gc.set_threshold(self.threshold, *self._saved[1:])
        logger.debug("collector: %d start-up objects frozen, young threshold %d", gc.get_freeze_count(),
                     self.threshold)

    def engine_stopped(self) -> None:
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        gc.unfreeze()
        self._saved = None
