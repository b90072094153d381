"""The simulated web: Baidu-like and Weibo-like search on loopback, serving each crawl node differently.

Used by the demo, the experiment, the tests and the benchmarks (never by production spiders unless pointed at
it through ``PC_ENGINE_BASE_URLS``). See docs/simweb.md; the pieces are :mod:`.profile` (who is served how
well), :mod:`.corpus` (the deterministic truth) and :mod:`.server` (the HTTP server and its launchers).
"""

from __future__ import annotations

from product_crawl.simweb.corpus import corpus_size, document, is_served, parse_query
from product_crawl.simweb.profile import Behaviour, Profile, ProfileError, load_profile, parse_profile
from product_crawl.simweb.server import LISTENING_PREFIX, SimWeb, SimWebProcess, listen, serve

__all__ = [
    "LISTENING_PREFIX",
    "Behaviour",
    "Profile",
    "ProfileError",
    "SimWeb",
    "SimWebProcess",
    "corpus_size",
    "document",
    "is_served",
    "listen",
    "load_profile",
    "parse_profile",
    "parse_query",
    "serve",
]
